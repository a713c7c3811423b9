"""Director's answers classified (`director.classification`)."""

from __future__ import annotations

import pytest

from control_plane_broker.director.classification import (
    AnswerError,
    DirectorCredentialsRefused,
    DirectorInternal,
    DirectorNotFound,
    DirectorPermanent,
    DirectorRetryable,
    DirectorTenantUnknown,
    classify,
    error_arguments,
)

# Director's words, as its presenter, its SQL mapper and its repositories write them
# (classification's docstring cites where).
COMMIT_BROKEN = (
    "Internal Server Error [errorID=e1, reason: while committing transaction: driver: bad "
    "connection]"
)
PARENT_CHECK_FAILED = (
    "Tenant 3f6c does not have access to the parent of the currently created runtimeLabel: "
    "while checking for tenant access: Internal Server Error: Unexpected error while executing "
    "SQL query"
)
PARENT_NOT_ACCESSIBLE = (
    "Tenant 3f6c does not have access to the parent of the currently created runtimeLabel: "
    "tenant 3f6c does not have access to the parent resource runtime with ID r1"
)


@pytest.mark.parametrize(
    ("status", "errors", "expected"),
    [
        # Compass's front door or Director failing: transport, 5xx, 429.
        (None, [], DirectorRetryable),
        (500, [], DirectorRetryable),
        (502, [], DirectorRetryable),
        (503, [(10, "x")], DirectorRetryable),
        (429, [], DirectorRetryable),
        # The broker's credentials: Oathkeeper or Director's auth middleware, and scopes.
        (401, [], DirectorCredentialsRefused),
        (403, [], DirectorCredentialsRefused),
        (200, [(23, "insufficient scopes provided")], DirectorCredentialsRefused),
        # A gateway's own 4xx, without Director's GraphQL errors.
        (404, [], DirectorRetryable),
        # Codes that name a moment, not the input.
        (200, [(28, "Maximum processing timeout reached")], DirectorRetryable),
        (200, [(32, "x")], DirectorRetryable),
        (200, [(35, "x")], DirectorRetryable),
        # Director's own failures, whatever they wrap (the real Director's answers, in shape).
        (200, [(10, "Internal Server Error [errorID=e1]")], DirectorInternal),
        (200, [(10, COMMIT_BROKEN)], DirectorInternal),
        (
            200,
            [(10, "Internal Server Error [errorID=e2, reason: Runtime with ID r doesn't exist]")],
            DirectorInternal,
        ),
        (200, [(11, "x")], DirectorInternal),
        (200, [(None, "x")], DirectorInternal),
        (200, [(26, PARENT_CHECK_FAILED)], DirectorInternal),
        (200, [(26, "missing or invalid authorization token")], DirectorInternal),
        # Code 26 stating a missing access: lasting, about the runtime's tenant.
        (200, [(26, "Owner access is needed for resource modification")], DirectorPermanent),
        (200, [(26, PARENT_NOT_ACCESSIBLE)], DirectorPermanent),
        # A document Director's schema refuses: HTTP 422, code 10 -- ours to fix, for good.
        (422, [(10, "Cannot query field")], DirectorPermanent),
        # Tenants Director does not know.
        (400, [(25, "Tenant not found [externalTenant=ga]")], DirectorTenantUnknown),
        (200, [(25, "Tenant not found")], DirectorTenantUnknown),
        (200, [(20, "Object not found [object=tenant]")], DirectorTenantUnknown),
        (200, [(20, "Object not found [object=runtime]")], DirectorNotFound),
        (
            200,
            [
                (
                    27,
                    "The operation is not allowed [object=systemAuth; "
                    "reason=The referenced entity does not exists]",
                )
            ],
            DirectorPermanent,
        ),
        (200, [(21, "x")], DirectorPermanent),
        (200, [(22, "x")], DirectorPermanent),
        (400, [(22, "x")], DirectorPermanent),
        (200, [], type(None)),
    ],
)
def test_classify(status: int | None, errors: list[tuple[int | None, str]], expected: type) -> None:
    found = [AnswerError(code, message) for code, message in errors]
    assert type(classify(status=status, errors=found, message="m")) is expected


@pytest.mark.parametrize(
    ("status", "errors", "written"),
    [
        # A typed error on the mutation's field comes before its COMMIT: rolled back.
        (200, [AnswerError(20, "Object not found [object=tenant]")], False),
        (200, [AnswerError(35, "x")], False),
        (200, [AnswerError(26, PARENT_CHECK_FAILED)], False),
        (400, [AnswerError(25, "Tenant not found", depth=0)], False),
        (401, [], False),
        (429, [], False),
        # Code 10 may be a COMMIT broken off after PostgreSQL committed.
        (200, [AnswerError(10, COMMIT_BROKEN)], True),
        (200, [AnswerError(11, "x")], True),
        # A field resolved after the mutation committed.
        (200, [AnswerError(10, COMMIT_BROKEN, depth=2)], True),
        (502, [], True),
    ],
)
def test_what_an_error_answer_proves_was_not_written(
    status: int, errors: list[AnswerError], written: bool
) -> None:
    problem = classify(status=status, errors=errors, message="m")
    assert problem is not None
    assert getattr(problem, "maybe_written", False) is written


def test_director_error_arguments_are_read_from_the_message_tail() -> None:
    refused = classify(
        status=200,
        errors=[
            AnswerError(
                27,
                "The operation is not allowed [object=systemAuth; "
                "reason=The referenced entity does not exists]",
            )
        ],
        message="m",
    )
    assert isinstance(refused, DirectorPermanent)
    assert refused.code == 27
    assert refused.arguments == {
        "object": "systemAuth",
        "reason": "The referenced entity does not exists",
    }
    tenant = classify(
        status=200, errors=[AnswerError(20, "Object not found [object=tenant]")], message="m"
    )
    assert isinstance(tenant, DirectorTenantUnknown)
    assert tenant.subaccount
    account = classify(status=400, errors=[AnswerError(25, "Tenant not found")], message="m")
    assert isinstance(account, DirectorTenantUnknown)
    assert not account.subaccount
    assert error_arguments("no tail") == {}
    assert error_arguments("x [broken") == {}
