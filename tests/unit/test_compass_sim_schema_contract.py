"""The simulator's SDL files are a consistent subset of the real Compass schemas.

Every type, field, argument (with default), input field and enum value the
simulator declares must exist with the same type in the real schema, and no
argument or input field the real schema requires may be missing, so that any
document valid against the simulator is valid against the real Compass.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from graphql import (
    GraphQLEnumType,
    GraphQLInputObjectType,
    GraphQLInterfaceType,
    GraphQLObjectType,
    GraphQLSchema,
    GraphQLUnionType,
    build_schema,
    is_required_argument,
    is_required_input_field,
    is_specified_scalar_type,
    parse,
    print_ast,
    validate,
)

import devenv.compass_sim
from control_plane_broker.director import documents as broker_documents
from devenv.compass_sim import operations
from devenv.compass_sim.graphql_http import load_schema
from devenv.compass_sim.testing import CONNECTOR_DOCUMENTS, DIRECTOR_DOCUMENTS

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_API = REPO_ROOT / ".." / "shared" / "compass-api"


def _real_schema(file_name: str) -> GraphQLSchema:
    path = SHARED_API / file_name
    if not path.exists():
        pytest.skip(f"real Compass schema {path} is absent: contract with Compass not checked")
    return build_schema(path.read_text())


def _default(node: object) -> str | None:
    value = getattr(node, "default_value", None)
    return print_ast(value) if value is not None else None


def contract_problems(sim: GraphQLSchema, real: GraphQLSchema) -> list[str]:
    problems: list[str] = []
    for root in ("query_type", "mutation_type", "subscription_type"):
        sim_root, real_root = getattr(sim, root), getattr(real, root)
        if sim_root is not None and (real_root is None or real_root.name != sim_root.name):
            problems.append(f"{root} {sim_root.name} is not the real one")
    for name, sim_type in sim.type_map.items():
        if name.startswith("__") or is_specified_scalar_type(sim_type):
            continue
        real_type = real.type_map.get(name)
        if real_type is None:
            problems.append(f"type {name} does not exist")
            continue
        if type(real_type) is not type(sim_type):
            problems.append(f"type {name} is a {type(real_type).__name__} in Compass")
            continue
        if isinstance(sim_type, GraphQLObjectType | GraphQLInterfaceType):
            assert isinstance(real_type, GraphQLObjectType | GraphQLInterfaceType)
            real_interfaces = {i.name for i in real_type.interfaces}
            problems += [
                f"{name} does not implement {i.name} in Compass"
                for i in sim_type.interfaces
                if i.name not in real_interfaces
            ]
            for field_name, field in sim_type.fields.items():
                where = f"{name}.{field_name}"
                real_field = real_type.fields.get(field_name)
                if real_field is None:
                    problems.append(f"field {where} does not exist")
                    continue
                if str(field.type) != str(real_field.type):
                    problems.append(f"{where}: {field.type} != {real_field.type}")
                for arg_name, arg in field.args.items():
                    real_arg = real_field.args.get(arg_name)
                    if real_arg is None:
                        problems.append(f"argument {where}({arg_name}) does not exist")
                    elif str(arg.type) != str(real_arg.type):
                        problems.append(f"{where}({arg_name}): {arg.type} != {real_arg.type}")
                    elif _default(arg.ast_node) != _default(real_arg.ast_node):
                        problems.append(f"{where}({arg_name}): default differs")
                problems += [
                    f"{where} lacks required argument {arg_name}"
                    for arg_name, real_arg in real_field.args.items()
                    if is_required_argument(real_arg) and arg_name not in field.args
                ]
        elif isinstance(sim_type, GraphQLInputObjectType):
            assert isinstance(real_type, GraphQLInputObjectType)
            for field_name, input_field in sim_type.fields.items():
                real_input = real_type.fields.get(field_name)
                if real_input is None:
                    problems.append(f"input field {name}.{field_name} does not exist")
                elif str(input_field.type) != str(real_input.type):
                    problems.append(f"{name}.{field_name}: {input_field.type} != {real_input.type}")
                elif _default(input_field.ast_node) != _default(real_input.ast_node):
                    problems.append(f"{name}.{field_name}: default differs")
            problems += [
                f"{name} lacks required input field {field_name}"
                for field_name, real_input in real_type.fields.items()
                if is_required_input_field(real_input) and field_name not in sim_type.fields
            ]
        elif isinstance(sim_type, GraphQLEnumType):
            assert isinstance(real_type, GraphQLEnumType)
            problems += [
                f"enum value {name}.{value} does not exist"
                for value in sim_type.values
                if value not in real_type.values
            ]
        elif isinstance(sim_type, GraphQLUnionType):
            assert isinstance(real_type, GraphQLUnionType)
            real_members = {t.name for t in real_type.types}
            problems += [
                f"union {name} has no member {t.name}"
                for t in sim_type.types
                if t.name not in real_members
            ]
    return problems


@pytest.mark.parametrize(
    ("sim_file", "real_file"),
    [("director.graphql", "director.graphql"), ("connector.graphql", "connector.graphql")],
)
def test_simulator_schema_is_a_subset_of_the_real_one(sim_file: str, real_file: str) -> None:
    assert contract_problems(load_schema(sim_file), _real_schema(real_file)) == []


def test_the_contract_check_finds_differences() -> None:
    real = _real_schema("director.graphql")
    wrong = build_schema(
        """
        scalar Labels
        enum RuntimeStatusCondition { INITIAL SLEEPING }
        input RuntimeRegisterInput { description: String, nickname: String }
        type Runtime { id: String!, name: String!, labels: Labels, extra: Int }
        type Query {
          runtimes(first: Int = 100): Runtime
          runtime(id: ID!, verbose: Boolean): Runtime
          requestOneTimeTokenForRuntime: Runtime
        }
        """
    )
    problems = contract_problems(wrong, real)
    for expected in [
        "Runtime.id: String! != ID!",
        "field Runtime.extra does not exist",
        "enum value RuntimeStatusCondition.SLEEPING does not exist",
        "input field RuntimeRegisterInput.nickname does not exist",
        "RuntimeRegisterInput lacks required input field name",
        "Query.runtimes: Runtime != RuntimePage!",
        "Query.runtimes(first): default differs",
        "argument Query.runtime(verbose) does not exist",
        "field Query.requestOneTimeTokenForRuntime does not exist",
    ]:
        assert expected in problems, problems
    # Leaving out an optional argument (labels(key:)) is allowed.
    assert not any("Runtime.labels" in p for p in problems)


def test_operation_catalogue_matches_the_schemas() -> None:
    director = load_schema("director.graphql")
    connector = load_schema("connector.graphql")
    assert director.query_type is not None
    assert director.mutation_type is not None
    assert set(director.query_type.fields) == operations.DIRECTOR_QUERIES
    assert set(director.mutation_type.fields) == operations.DIRECTOR_MUTATIONS
    assert connector.query_type is not None
    assert connector.mutation_type is not None
    assert (
        set(connector.query_type.fields) | set(connector.mutation_type.fields)
        == operations.CONNECTOR_OPERATIONS
    )
    assert all(operations.required_scope(q) == "runtime:read" for q in operations.DIRECTOR_QUERIES)
    assert all(
        operations.required_scope(m) == "runtime:write" for m in operations.DIRECTOR_MUTATIONS
    )


@pytest.mark.parametrize(
    ("file_name", "documents"),
    [("director.graphql", DIRECTOR_DOCUMENTS), ("connector.graphql", CONNECTOR_DOCUMENTS)],
)
def test_test_documents_are_valid_against_simulator_and_compass(
    file_name: str, documents: tuple[str, ...]
) -> None:
    sim, real = load_schema(file_name), _real_schema(file_name)
    for document in documents:
        ast = parse(document)
        assert validate(sim, ast) == [], document
        assert validate(real, ast) == [], document


@pytest.mark.parametrize("name", sorted(broker_documents.ALL_DOCUMENTS))
def test_every_broker_document_is_served_by_the_simulator(name: str) -> None:
    # The broker's integration tests run against the simulator: a document it cannot validate
    # would be tested there against nothing.
    ast = parse(broker_documents.ALL_DOCUMENTS[name])
    assert validate(load_schema("director.graphql"), ast) == [], name


def test_public_names() -> None:
    assert set(devenv.compass_sim.__all__) == {
        "ALL_OPERATIONS",
        "READ_SCOPE",
        "WRITE_SCOPE",
        "CompassSimulator",
        "ConcurrencyStats",
        "ConnectorTokenRecord",
        "CsrSubject",
        "DownMode",
        "ErrorCode",
        "Faults",
        "InjectedError",
        "Latency",
        "LostResponseMode",
        "OperationCounter",
        "Outcome",
        "RateLimit",
        "RequestRecord",
        "RuntimeRecord",
        "RuntimeStatusCondition",
        "SimConfig",
        "TokenKind",
    }
    for name in devenv.compass_sim.__all__:
        assert hasattr(devenv.compass_sim, name)
