"""Every broker error as one status and problem type (`errors`, `api.problems`)."""

from __future__ import annotations

import pytest

from control_plane_broker import errors
from control_plane_broker.api.problems import TYPE_PREFIX, problem_for


def _concrete_errors() -> list[type[errors.BrokerError]]:
    """Every error class the broker defines below the three roots: a new one is covered
    without being listed anywhere."""
    roots = {errors.BrokerError, errors.TemporaryError, errors.PermanentError}
    return sorted(
        (
            c
            for c in vars(errors).values()
            if isinstance(c, type) and issubclass(c, errors.BrokerError) and c not in roots
        ),
        key=lambda c: c.__name__,
    )


ERRORS = _concrete_errors()


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_every_error_maps_to_one_status_and_type(cls: type[errors.BrokerError]) -> None:
    if issubclass(cls, errors.IdentityNotProven | errors.IdentityForbidden):
        exc: errors.BrokerError = cls("m", reason="r")
    elif issubclass(cls, errors.CompassTenantUnknown):
        exc = cls("m", label="kyma-project.io/subaccount-id", value="sa")
    elif issubclass(cls, errors.TemporaryError):
        exc = cls("m", retry_after=2.0)
    else:
        exc = cls("m")
    p = problem_for(exc, instance="/x", jitter_max=3.0, rand=lambda: 0.5)
    assert p.status == cls.status
    assert p.body["type"] == TYPE_PREFIX + cls.slug
    assert p.body["status"] == cls.status
    assert p.status != 500  # never a bare 500, also not for a bug
    if cls.status in (429, 503):
        assert issubclass(cls, errors.TemporaryError)
        spread = cls.spread  # type: ignore[attr-defined]
        # ceil(2.0 + 0.5*3) with jitter; exactly the reserved 2 s without
        assert p.headers["Retry-After"] == ("4" if spread else "2")
    else:
        assert "Retry-After" not in p.headers


def test_problem_types_are_distinct_and_statuses_as_documented() -> None:
    # A subclass may keep its parent's problem type (CompassDown is a CompassUnavailable whose
    # Retry-After is a reservation); every class that names its own type names a new one.
    own = [c for c in ERRORS if "slug" in vars(c)]
    assert len({c.slug for c in own}) == len(own)
    statuses = {c.__name__: c.status for c in ERRORS}
    assert statuses["MalformedRequest"] == 400
    assert statuses["IdentityNotProven"] == 401
    assert statuses["IdentityForbidden"] == 403
    assert statuses["RuntimeNotFound"] == 404
    assert statuses["ModuleNotEnabled"] == statuses["KymaDeleting"] == 409
    assert statuses["RateLimited"] == 429
    assert statuses["CompassUnavailable"] == 503
    assert statuses["CapacityReserved"] == statuses["RuntimeKubeconfigInvalid"] == 503
    assert statuses["InternalError"] == 503
    assert statuses["CompassRejected"] == 502


def test_a_reservation_is_told_exactly_others_are_spread() -> None:
    # The schedule already spread the herd over Director's capacity: jitter would only make
    # agents miss their reservation. Refusals a herd receives at once are spread.
    reserved = problem_for(
        errors.CapacityReserved("reserved", retry_after=7.2),
        instance="/x",
        jitter_max=5,
        rand=lambda: 0.9,
    )
    assert (reserved.status, reserved.body["type"]) == (503, TYPE_PREFIX + "capacity-booked")
    assert reserved.headers["Retry-After"] == "8"
    other = problem_for(
        errors.CompassUnavailable("open", retry_after=7.2),
        instance="/x",
        jitter_max=5,
        rand=lambda: 0.9,
    )
    assert other.headers["Retry-After"] == "12"  # ceil(7.2 + 4.5)
    unspread = [c for c in ERRORS if issubclass(c, errors.TemporaryError) and not c.spread]
    assert unspread == [errors.CapacityReserved, errors.CompassDown, errors.FirstContactsBusy]
