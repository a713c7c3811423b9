"""schemathesis against a real broker process, in each identity mode: no input makes it fail.

The broker runs as the README starts it, with a real KCP API server (a seeded Kyma and its
runtime kubeconfig Secret), a real runtime API server and the Compass simulator behind it; the
schema is the broker's own `/openapi.json`, unchanged. Every operation is fuzzed with data that
fits the schema and with data that does not; the token endpoint also with the seeded runtime's
ID (any proof), with its ID and a real proof of its identity (every other input generated), and
so again while Director answers 503: registration, token issue and Compass outages are fuzzed
too, not only the refusals; the connection report endpoint also with the runtime's ID and proof
and any report body, valid or not, so recording on the mapping is fuzzed as well.

Each answer must: never be 500; when it is any other 5xx, be `application/problem+json` whose
`type` is listed for that status in the docs' status tables (never `internal-error`, a bug
caught by the last-resort handler), whose `status` is the HTTP status, and, for 503, with a
`Retry-After` in whole seconds; and pass schemathesis's own checks (status code, content type,
headers and body as documented in the schema) except its blanket "no 5xx": a 503 is the
broker's legitimate answer to a temporary condition, so the stricter rule above replaces it.

Bounded: a fixed number of examples per operation and flavour, no shrinking, a timeout per
request and per test. Each mode must have checked a minimum number of cases, issued at least
one token and answered at least one 503, so a run that silently fuzzed nothing fails.

(schemathesis's lazy pytest loader, `schemathesis.pytest.from_fixture`, cannot run on pytest
9.2: it writes `Node._nodeid`, which pytest's slotted nodes no longer have. So the schema is
loaded in the test, and each operation's strategy is run by Hypothesis directly.)
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from devenv.clusters import TestCluster
from devenv.compass_sim.faults import DownMode, Faults
from tests.integration.broker.conftest import REPO_ROOT, BrokerFactory, Runtime, seed_runtime

TOKEN_PATH = "/v1/runtimes/{runtimeID}/token"
REPORT_PATH = "/v1/runtimes/{runtimeID}/connection"
PROBLEM_PREFIX = "urn:kyma-compass-pull:broker:problem:"
EXAMPLES = 60  # per operation and flavour
MIN_CASES_PER_MODE = 200
REQUEST_TIMEOUT = 20.0
STATUS_ROW = re.compile(r"^\|\s*(\d{3})\s*\|(.*)$")


def documented_problem_types() -> dict[str, int]:
    """slug -> status, from the status tables of the broker's docs (what operators read)."""
    out: dict[str, int] = {}
    for doc in ("docs/broker.md", "docs/security.md"):
        for line in (REPO_ROOT / doc).read_text().splitlines():
            row = STATUS_ROW.match(line)
            if row:
                for slug in re.findall(r"`([a-z][a-z-]+)`", row.group(2)):
                    out[slug] = int(row.group(1))
    return out


DOCUMENTED = documented_problem_types()


def server_error_problems(status: int, headers: Mapping[str, str], text: str) -> list[str]:
    """What is wrong with a 5xx answer (nothing for a proper one, nor for any other status).
    `headers` by lower-case name."""
    if status < 500:
        return []
    if status == 500:
        return [f"HTTP 500: {text[:300]!r}"]
    media = headers.get("content-type", "")
    if not media.startswith("application/problem+json"):
        return [f"{status} with content-type {media!r}: {text[:300]!r}"]
    body = json.loads(text)
    slug = str(body.get("type", "")).removeprefix(PROBLEM_PREFIX)
    wrong: list[str] = []
    if slug == "internal-error":
        wrong.append(f"{status} internal-error: a bug behind the last-resort handler")
    elif DOCUMENTED.get(slug) != status:
        wrong.append(f"{status} with type {body.get('type')!r}, not documented for {status}")
    if body.get("status") != status:
        wrong.append(f"body status {body.get('status')!r} on a {status}")
    if status == 503 and not re.fullmatch(r"\d+", headers.get("retry-after", "")):
        wrong.append(f"503 {slug} without a Retry-After in seconds")
    return wrong


@dataclass(frozen=True)
class Flavour:
    name: str
    generation: GenerationMode
    path_parameters: dict[str, str] | None = None
    headers: dict[str, str] | None = None
    compass_down: bool = False  # Director answers 503 while this flavour runs


def identity_header(mode: str, rt: Runtime) -> dict[str, str]:
    """A header that proves `rt`'s identity in `mode`."""
    if mode == "xfcc":
        return {"x-forwarded-client-cert": f'Hash=abc;Subject="O=kyma,CN={rt.runtime_id}";URI='}
    return {"authorization": f"Bearer {rt.token()}"}


def flavours(operation: Any, mode: str, rt: Runtime) -> list[Flavour]:
    out = [Flavour("fits the schema", GenerationMode.POSITIVE)]
    if len(operation.path_parameters) + len(operation.headers) + len(operation.query):
        # Only input can break the schema; the probes take none.
        out.append(Flavour("breaks the schema", GenerationMode.NEGATIVE))
    known, proof = {"runtimeID": rt.runtime_id}, identity_header(mode, rt)
    if operation.path == TOKEN_PATH:
        out += [
            Flavour("known runtime, any proof", GenerationMode.POSITIVE, known),
            Flavour("known runtime, its proof", GenerationMode.POSITIVE, known, proof),
            Flavour("Compass down", GenerationMode.POSITIVE, known, proof, compass_down=True),
        ]
    if operation.path == REPORT_PATH:
        # Any report body, valid or not, from the runtime itself: the report is recorded (the
        # token flavours ran first and made the mapping), or refused as documented.
        out += [
            Flavour("known runtime, its proof, any report", GenerationMode.POSITIVE, known, proof),
            Flavour("known runtime, its proof, bad report", GenerationMode.NEGATIVE, known, proof),
        ]
    return out


def fuzz(
    operation: Any, flavour: Flavour, *, session: requests.Session, sim: Any, seen: Counter[int]
) -> None:
    strategy = operation.as_strategy(
        generation_mode=flavour.generation,
        path_parameters=flavour.path_parameters,
        headers=flavour.headers,
    )

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure is shown as found
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(case=strategy)
    def one(case: Any) -> None:
        response = case.call(session=session, timeout=REQUEST_TIMEOUT)
        seen[response.status_code] += 1
        where = f"{flavour.name}: {case.as_curl_command()}"
        headers = {name: ", ".join(values) for name, values in response.headers.items()}
        wrong = server_error_problems(response.status_code, headers, response.text)
        assert not wrong, f"{where}\n{wrong}"
        case.validate_response(response, excluded_checks=[not_a_server_error])

    if flavour.compass_down:
        sim.set_faults(Faults(down=DownMode.UNAVAILABLE))
    try:
        one()
    except Unsatisfiable:
        # Negative data needs a constraint to break; an input the schema leaves free (any
        # string) has none, and then there is nothing to send.
        if flavour.generation is not GenerationMode.NEGATIVE:
            raise
    finally:
        sim.clear_faults()


@pytest.fixture
def rt(control_plane: TestCluster, kcp_ns: str, runtime_a: TestCluster) -> Runtime:
    return seed_runtime(control_plane, kcp_ns, runtime_a)


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        s.trust_env = False
        yield s


@pytest.mark.timeout(100)
@pytest.mark.parametrize("mode", ["tokenreview", "jwks", "xfcc"])
def test_no_input_makes_the_broker_fail(
    mode: str, brokers: BrokerFactory, rt: Runtime, sim: Any, session: requests.Session
) -> None:
    env = {
        "BROKER_IDENTITY_MODE": mode,
        "BROKER_RATE_LIMIT_BURST": "1000",
        "BROKER_REPORT_MIN_INTERVAL_SECONDS": "0.001",
        "BROKER_API_DOCS": "true",
    }
    if mode == "xfcc":
        env["BROKER_XFCC_TRUSTED"] = "true"
    broker = brokers(**env)
    schema = schemathesis.openapi.from_url(f"{broker.url}/openapi.json")
    schema.config.update(base_url=broker.url)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {TOKEN_PATH, REPORT_PATH} <= {op.path for op in operations}
    # The token endpoint first: its flavours register the runtime the reports are recorded on.
    operations.sort(key=lambda op: op.path != TOKEN_PATH)

    seen: Counter[int] = Counter()
    for operation in operations:
        for flavour in flavours(operation, mode, rt):
            fuzz(operation, flavour, session=session, sim=sim, seen=seen)

    cases = sum(seen.values())
    assert cases >= MIN_CASES_PER_MODE, f"only {cases} cases ran: {seen}"
    assert seen[201] > 0, f"no token was issued, the deep path went unfuzzed: {seen}"
    assert seen[202] > 0, f"no report was recorded, the report path went unfuzzed: {seen}"
    assert seen[503] > 0, f"no 503 was answered, the 5xx rule went unused: {seen}"
    assert broker.running()
    assert not [e for e in broker.logs() if e.get("msg") == "unexpected error"]


def test_the_server_error_rule_refuses_what_the_broker_must_never_answer() -> None:
    problem = {"content-type": "application/problem+json"}

    def wrong(status: int, slug: str, **headers: str) -> list[str]:
        body = {"type": PROBLEM_PREFIX + slug, "status": status}
        return server_error_problems(status, headers, json.dumps(body))

    assert not wrong(503, "compass-unavailable", **problem, **{"retry-after": "3"})
    assert not wrong(502, "compass-rejected", **problem)
    assert not wrong(404, "whatever")
    assert wrong(500, "compass-unavailable", **problem, **{"retry-after": "3"})
    assert wrong(503, "compass-unavailable", **{"retry-after": "3"})  # plain JSON
    assert wrong(503, "compass-unavailable", **problem)  # no Retry-After
    assert wrong(503, "compass-unavailable", **problem, **{"retry-after": "soon"})
    assert wrong(503, "internal-error", **problem, **{"retry-after": "5"})  # a bug
    assert wrong(502, "made-up", **problem)  # not documented
    assert wrong(503, "compass-rejected", **problem, **{"retry-after": "5"})  # documented as 502
