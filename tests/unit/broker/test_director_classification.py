"""Director's answers classified (`director.classification`)."""

from __future__ import annotations

import pytest

from control_plane_broker.director.classification import (
    DirectorFailed,
    DirectorNotFound,
    DirectorPermanent,
    DirectorRetryable,
    DirectorTenantUnknown,
    classify,
    error_arguments,
)


@pytest.mark.parametrize(
    ("status", "errors", "expected"),
    [
        # Outages reach the broker as HTTP: transport, 5xx, 429.
        (None, [], DirectorRetryable),
        (500, [], DirectorRetryable),
        (502, [], DirectorRetryable),
        (503, [(10, "x")], DirectorRetryable),
        (429, [], DirectorRetryable),
        # Codes that name a moment, not the input.
        (200, [(28, "Maximum processing timeout reached")], DirectorRetryable),
        (200, [(32, "x")], DirectorRetryable),
        (200, [(35, "x")], DirectorRetryable),
        # Code 10 names nothing (the real Director's answers, verbatim in shape).
        (200, [(10, "Internal Server Error [errorID=e1]")], DirectorFailed),
        (
            200,
            [(10, "Internal Server Error [errorID=e2, reason: Runtime with ID r doesn't exist]")],
            DirectorFailed,
        ),
        (200, [(11, "x")], DirectorFailed),
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
        (200, [(26, "x")], DirectorPermanent),
        (200, [(None, "x")], DirectorPermanent),
        (400, [], DirectorPermanent),
        (200, [], type(None)),
    ],
)
def test_classify(status: int | None, errors: list[tuple[int | None, str]], expected: type) -> None:
    assert type(classify(status=status, errors=errors, message="m")) is expected


def test_director_error_arguments_are_read_from_the_message_tail() -> None:
    refused = classify(
        status=200,
        errors=[
            (
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
    tenant = classify(status=200, errors=[(20, "Object not found [object=tenant]")], message="m")
    assert isinstance(tenant, DirectorTenantUnknown)
    assert tenant.subaccount
    account = classify(status=400, errors=[(25, "Tenant not found")], message="m")
    assert isinstance(account, DirectorTenantUnknown)
    assert not account.subaccount
    assert error_arguments("no tail") == {}
    assert error_arguments("x [broken") == {}
