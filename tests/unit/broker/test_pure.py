"""Table-driven tests of the broker's pure decisions: breaker, rate limit, claims, naming,
transitions, policy, problems, error classification, reconcile plan."""

from __future__ import annotations

import base64
import dataclasses
import json
import re

import pytest

from control_plane_broker import circuit_breaker as cb
from control_plane_broker import errors
from control_plane_broker.api.problems import TYPE_PREFIX, problem_for
from control_plane_broker.director.errors import (
    DirectorFailed,
    DirectorNotFound,
    DirectorPermanent,
    DirectorRetryable,
    DirectorTenantUnknown,
    classify,
    error_arguments,
)
from control_plane_broker.identity import claims
from control_plane_broker.model import KymaView
from control_plane_broker.policy import check_token_allowed, validate_runtime_id
from control_plane_broker.ratelimit import BucketPolicy, take
from control_plane_broker.reconciler import (
    Nothing,
    Release,
    Requeue,
    SyncLabels,
    Unregister,
    plan,
)
from control_plane_broker.registration import naming, state
from control_plane_broker.retry import backoff, retry_after_seconds
from observability.logs import redact
from tests.unit.broker.mapping_views import mapping_view as _mapping

POLICY = cb.BreakerPolicy(failure_threshold=3, open_seconds=10.0)


# --- circuit breaker -------------------------------------------------------------------------


def test_breaker_opens_after_threshold_consecutive_failures() -> None:
    b = cb.Breaker()
    for i in range(2):
        b = cb.record_failure(b, POLICY, now=float(i))
        assert b.state is cb.State.CLOSED
    b = cb.record_failure(b, POLICY, now=5.0)
    assert b.state is cb.State.OPEN
    b2, adm = cb.admit(b, POLICY, now=6.0)
    assert not adm.allowed
    assert adm.retry_after == pytest.approx(9.0)
    assert b2 == b


def test_breaker_success_resets_the_consecutive_count() -> None:
    b = cb.record_failure(cb.record_failure(cb.Breaker(), POLICY, 0), POLICY, 0)
    b = cb.record_success(b)
    b = cb.record_failure(b, POLICY, 1)
    assert b.state is cb.State.CLOSED
    assert b.failures == 1


def test_one_runtimes_internal_errors_never_open_the_breaker() -> None:
    b = cb.Breaker()
    for i in range(50):
        b = cb.record_ambiguous(b, POLICY, float(i), "runtime-1")
    assert b.state is cb.State.CLOSED
    assert b.failures == 1
    assert b.suspects == frozenset({"runtime-1"})


def test_internal_errors_of_different_runtimes_in_a_row_open_the_breaker() -> None:
    b = cb.record_ambiguous(cb.Breaker(), POLICY, 0.0, "a")
    b = cb.record_ambiguous(b, POLICY, 1.0, "a")
    b = cb.record_ambiguous(b, POLICY, 2.0, "b")
    assert b.state is cb.State.CLOSED
    # Outages and internal errors add up: Director failing everyone, one way or the other.
    b = cb.record_failure(b, POLICY, 3.0)
    assert b.state is cb.State.OPEN
    assert b.suspects == frozenset()
    assert b.opened_at == 3.0


def test_a_success_ends_the_run_of_suspects() -> None:
    b = cb.record_ambiguous(cb.Breaker(), POLICY, 0.0, "a")
    b = cb.record_success(b)
    assert b == cb.Breaker()
    b = cb.record_ambiguous(b, POLICY, 1.0, "a")
    assert b.failures == 1


def test_a_probe_that_meets_an_internal_error_opens_the_breaker_again() -> None:
    b = cb.Breaker(state=cb.State.HALF_OPEN, failures=3, probe_in_flight=True, suspects=frozenset())
    b = cb.record_ambiguous(b, POLICY, 20.0, "a")
    assert b.state is cb.State.OPEN
    assert b.opened_at == 20.0


@pytest.mark.parametrize(
    ("probe_ok", "end_state"), [(True, cb.State.CLOSED), (False, cb.State.OPEN)]
)
def test_breaker_half_open_admits_exactly_one_probe(probe_ok: bool, end_state: cb.State) -> None:
    b = cb.Breaker(state=cb.State.OPEN, failures=3, opened_at=0.0)
    b, first = cb.admit(b, POLICY, now=10.0)
    assert first.allowed
    assert b.state is cb.State.HALF_OPEN
    b, second = cb.admit(b, POLICY, now=10.1)
    assert not second.allowed
    b = cb.record_success(b) if probe_ok else cb.record_failure(b, POLICY, now=11.0)
    assert b.state is end_state
    if not probe_ok:
        assert b.opened_at == 11.0  # the timer restarts


@pytest.mark.parametrize(
    ("breaker", "now", "refused"),
    [
        (cb.Breaker(), 0.0, False),
        (cb.Breaker(failures=2), 0.0, False),
        (cb.Breaker(state=cb.State.OPEN, opened_at=100.0), 105.0, True),
        (cb.Breaker(state=cb.State.OPEN, opened_at=100.0), 110.0, False),  # the probe's turn
        (cb.Breaker(state=cb.State.HALF_OPEN, probe_in_flight=True), 0.0, True),
        (cb.Breaker(state=cb.State.HALF_OPEN, probe_in_flight=False), 0.0, False),
    ],
)
def test_would_refuse_answers_like_admit_without_changing_anything(
    breaker: cb.Breaker, now: float, refused: bool
) -> None:
    assert cb.would_refuse(breaker, POLICY, now) is refused
    _, admission = cb.admit(breaker, POLICY, now)
    assert admission.allowed is not refused


def test_breaker_released_probe_lets_the_next_caller_probe() -> None:
    b = cb.Breaker(state=cb.State.HALF_OPEN, probe_in_flight=True)
    b = cb.release_probe(b)
    _, adm = cb.admit(b, POLICY, now=0)
    assert adm.allowed


# --- rate limit and Retry-After ----------------------------------------------------------------


def test_bucket_allows_burst_then_waits_for_refill() -> None:
    policy = BucketPolicy(burst=2, per_second=0.5)
    bucket, wait = take(None, policy, now=0.0)
    assert wait is None
    bucket, wait = take(bucket, policy, now=0.0)
    assert wait is None
    bucket, wait = take(bucket, policy, now=0.0)
    assert wait == pytest.approx(2.0)
    bucket, wait = take(bucket, policy, now=2.0)
    assert wait is None


@pytest.mark.parametrize(
    ("base", "jitter", "rand", "expected"),
    [(0.0, 0.0, 0.0, 1), (2.2, 0.0, 0.9, 3), (2.0, 5.0, 0.5, 5), (30.0, 5.0, 0.999, 35)],
)
def test_retry_after_is_whole_seconds_with_jitter(
    base: float, jitter: float, rand: float, expected: int
) -> None:
    assert retry_after_seconds(base, jitter_max=jitter, rand=lambda: rand) == expected


# --- claims -----------------------------------------------------------------------------------

ALLOWED = frozenset({("kyma-system", "compass-agent")})


@pytest.mark.parametrize(
    ("username", "error"),
    [
        ("system:serviceaccount:kyma-system:compass-agent", None),
        ("system:serviceaccount:default:compass-agent", errors.IdentityForbidden),
        ("system:serviceaccount:kyma-system:other", errors.IdentityForbidden),
        ("admin", errors.IdentityForbidden),
        ("system:serviceaccount:kyma-system", errors.IdentityForbidden),
        ("system:serviceaccount:a:b:c", errors.IdentityForbidden),
    ],
)
def test_service_account_allow_list(username: str, error: type[Exception] | None) -> None:
    if error is None:
        assert claims.check_service_account(username, ALLOWED) == ("kyma-system", "compass-agent")
    else:
        with pytest.raises(error):
            claims.check_service_account(username, ALLOWED)


def test_audience() -> None:
    claims.check_audience(["x", "compass-broker"], "compass-broker")
    with pytest.raises(errors.IdentityNotProven):
        claims.check_audience(["https://kubernetes.default.svc"], "compass-broker")


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer abc", True),
        ("bearer abc", True),
        ("Basic abc", False),
        ("Bearer ", False),
        (None, False),
    ],
)
def test_bearer_token(header: str | None, ok: bool) -> None:
    if ok:
        assert claims.bearer_token(header) == "abc"
    else:
        with pytest.raises(errors.IdentityNotProven):
            claims.bearer_token(header)


def _jwt(payload: dict[str, object]) -> str:
    def part(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(payload)}.sig"


def test_cache_lifetime_bound_by_token_expiry_and_maximum() -> None:
    assert claims.unverified_expiry(_jwt({"exp": 1234})) == 1234.0
    assert claims.unverified_expiry("garbage") is None
    assert claims.cache_until(now=0, token_expiry=50, max_seconds=600) == 50
    assert claims.cache_until(now=0, token_expiry=5000, max_seconds=600) == 600
    assert claims.cache_until(now=0, token_expiry=None, max_seconds=600) == 600


def test_fingerprint_binds_runtime_and_hides_token() -> None:
    a = claims.token_fingerprint("rt-a", "secret-token")
    assert a != claims.token_fingerprint("rt-b", "secret-token")
    assert "secret-token" not in a


# --- naming -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shoot", "runtime_id", "expected"),
    [
        ("c-12ab34", "x", "c-12ab34"),
        ("My_Shoot!!Name", "x", "my-shoot-name"),
        (None, "8F0E2B6C-1234-4ABC-9DEF-0123456789AB", "kyma-8f0e2b6c-1234-4abc-9def-0123456"),
        ("123abc", "x", "kyma-123abc"),
        ("a" * 50, "x", "a" * 36),
        ("---", "", "kyma-runtime"),
        ("ab" + "-" * 40 + "c", "x", "ab-c"),
    ],
)
def test_derive_name_is_valid_for_director(
    shoot: str | None, runtime_id: str, expected: str
) -> None:
    name = naming.derive_name(shoot_name=shoot, runtime_id=runtime_id)
    assert name == expected
    assert naming.is_valid_name(name)
    assert len(name) <= 36


def _kyma(**labels: str) -> KymaView:
    return KymaView(
        name="rt-1", namespace="kcp-system", uid="u", resource_version="1", labels=labels
    )


def test_director_labels_keep_compass_manager_set_and_add_ours() -> None:
    kyma = _kyma(
        **{
            "kyma-project.io/runtime-id": "RT-1",
            "kyma-project.io/global-account-id": "ga",
            "kyma-project.io/subaccount-id": "sa",
            "kyma-project.io/shoot-name": "c-1",
            "kyma-project.io/instance-id": "inst",
            "kyma-project.io/broker-plan-id": "pid",
            "kyma-project.io/broker-plan-name": "azure",
        }
    )
    labels = naming.director_labels(
        kyma, managed_by="compass-manager", runtime_id_label="kyma_runtime_id"
    )
    assert labels == {
        "director_connection_managed_by": "compass-manager",
        "kyma_runtime_id": "RT-1",
        "broker_instance_id": "inst",
        "gardenerClusterName": "c-1",
        "global_subaccount_id": "sa",
        "global_account_id": "ga",
        "broker_plan_id": "pid",
        "broker_plan_name": "azure",
    }
    assert all(re.fullmatch(r"[A-Za-z0-9_]+", k) for k in labels)  # Director's label keys
    assert naming.label_changes(labels, {**labels, "broker_plan_name": "aws"}) == {
        "broker_plan_name": "azure"
    }
    assert naming.label_changes(labels, labels) == {}


# --- registration transitions -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mapping", "expected"),
    [
        (None, state.CreateClaimed()),
        (_mapping(compass_id="c-1"), state.Adopt("c-1")),
        (_mapping(compass_id="c-1", holder="other", expires=200), state.Adopt("c-1")),
        (_mapping(deleting=True), state.Refuse("mapping is being deleted")),
        # Recorded but on its way out: no token goes to a runtime being unregistered.
        (_mapping(compass_id="c-1", deleting=True), state.Refuse("mapping is being deleted")),
        (_mapping(holder="other", expires=130), state.Wait(retry_after=30)),
        (_mapping(holder="me", expires=130), state.Proceed(claim_expires=130)),
        (_mapping(holder="other", expires=90), state.TakeClaim("7")),
        (_mapping(holder="me", expires=90), state.TakeClaim("7")),
        (_mapping(), state.TakeClaim("7")),
    ],
)
def test_decide(mapping: state.Mapping | None, expected: state.Decision) -> None:
    assert state.decide(mapping, me="me", now=100.0) == expected


@pytest.mark.parametrize(
    ("ours", "legacy", "expected"),
    [
        ([], [], state.Register()),
        (["b"], [], state.Record("b")),
        (["c", "a", "b"], ["z"], state.Record("a", duplicates=("b", "c"))),
        ([], ["z"], state.Record("z")),
    ],
)
def test_after_lookup(ours: list[str], legacy: list[str], expected: object) -> None:
    assert state.after_lookup(ours, legacy) == expected


def test_safe_to_register_needs_claim_time_for_the_call() -> None:
    assert state.safe_to_register(claim_expires=100, now=50, call_budget=35)
    assert not state.safe_to_register(claim_expires=100, now=70, call_budget=35)


def test_mapping_round_trip_claim_and_record() -> None:
    kyma = _kyma(
        **{
            "kyma-project.io/global-account-id": "ga",
            "kyma-project.io/runtime-id": "RT-1",
            "kyma-project.io/shoot-name": "c-1",
        }
    )
    obj = state.new_mapping(kyma, namespace="kcp-system", me="me", now=0, claim_seconds=60)
    obj["metadata"]["resourceVersion"] = "1"
    m = state.Mapping.from_object(obj)
    assert (m.claim_holder, m.claim_expires, m.compass_id, m.tenant) == ("me", 60.0, None, "ga")
    # Kept as the Kyma had them (case too): the sweep finds a crashed registration by them
    # in Director even after the Kyma is gone.
    assert (m.runtime_id, m.shoot) == ("RT-1", "c-1")
    assert obj["metadata"]["labels"]["kyma-project.io/runtime-id"] == "RT-1"
    assert obj["metadata"]["labels"]["kyma-project.io/shoot-name"] == "c-1"
    assert state.FINALIZER in m.finalizers
    rec = state.Mapping.from_object(state.recorded(m, compass_id="c-9"))
    assert rec.compass_id == "c-9"
    assert rec.claim_holder is None
    assert rec.resource_version == "1"  # the write is conditional on what was read
    assert state.FINALIZER not in state.Mapping.from_object(state.without_finalizer(rec)).finalizers


def test_condition_transition_time_changes_only_on_flip() -> None:
    c1 = state.set_condition([], type_="Registered", status=True, reason="r", message="m", now=0)
    c2 = state.set_condition(c1, type_="Registered", status=True, reason="r2", message="m", now=100)
    assert c2[0]["lastTransitionTime"] == c1[0]["lastTransitionTime"]
    assert c2[0]["reason"] == "r2"
    c3 = state.set_condition(c2, type_="Registered", status=False, reason="r", message="m", now=100)
    assert c3[0]["lastTransitionTime"] != c1[0]["lastTransitionTime"]


# --- policy -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("runtime_id", "ok"),
    [
        ("8F0E2B6C-1234-4ABC-9DEF-0123456789AB", True),
        ("a", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("-abc", False),
        ('abc"}', False),
        ("abc/def", False),
        ("", False),
        ("abc_def", False),
    ],
)
def test_runtime_id_validation(runtime_id: str, ok: bool) -> None:
    if ok:
        assert validate_runtime_id(runtime_id) == runtime_id.lower()
    else:
        with pytest.raises(errors.MalformedRequest):
            validate_runtime_id(runtime_id)


GA = {"kyma-project.io/global-account-id": "ga"}


@pytest.mark.parametrize(
    ("kyma", "required", "error"),
    [
        (None, True, errors.RuntimeNotFound),
        (
            KymaView(
                "k",
                "ns",
                "u",
                "1",
                GA,
                deleting=True,
                spec_modules=frozenset({"application-connector"}),
            ),
            True,
            errors.KymaDeleting,
        ),
        (KymaView("k", "ns", "u", "1", GA), True, errors.ModuleNotEnabled),
        (KymaView("k", "ns", "u", "1", GA), False, None),
        (
            KymaView("k", "ns", "u", "1", GA, spec_modules=frozenset({"application-connector"})),
            True,
            None,
        ),
        (
            KymaView("k", "ns", "u", "1", GA, status_modules=frozenset({"application-connector"})),
            True,
            None,
        ),
        (
            KymaView("k", "ns", "u", "1", {}, spec_modules=frozenset({"application-connector"})),
            True,
            errors.KymaIncomplete,
        ),
    ],
)
def test_token_policy(kyma: KymaView | None, required: bool, error: type[Exception] | None) -> None:
    if error is None:
        assert (
            check_token_allowed(kyma, module="application-connector", module_required=required)
            is kyma
        )
    else:
        with pytest.raises(error):
            check_token_allowed(kyma, module="application-connector", module_required=required)


# --- problems ----------------------------------------------------------------------------------


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
        # ceil(2.0 + 0.5*3) with jitter; exactly the booked 2 s without
        assert p.headers["Retry-After"] == ("4" if spread else "2")
    else:
        assert "Retry-After" not in p.headers


def test_problem_types_are_distinct_and_statuses_as_documented() -> None:
    # A subclass may keep its parent's problem type (CompassDown is a CompassUnavailable whose
    # Retry-After is a booked turn); every class that names its own type names a new one.
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
    assert statuses["TurnBooked"] == statuses["RuntimeKubeconfigInvalid"] == 503
    assert statuses["InternalError"] == 503
    assert statuses["CompassRejected"] == 502


def test_a_booked_turn_is_told_exactly_others_are_spread() -> None:
    # The calendar already spread the herd over Director's capacity: jitter would only make
    # agents miss their turn. Refusals a herd receives at once are spread.
    booked = problem_for(
        errors.TurnBooked("booked", retry_after=7.2), instance="/x", jitter_max=5, rand=lambda: 0.9
    )
    assert (booked.status, booked.body["type"]) == (503, TYPE_PREFIX + "capacity-booked")
    assert booked.headers["Retry-After"] == "8"
    other = problem_for(
        errors.CompassUnavailable("open", retry_after=7.2),
        instance="/x",
        jitter_max=5,
        rand=lambda: 0.9,
    )
    assert other.headers["Retry-After"] == "12"  # ceil(7.2 + 4.5)
    unspread = [c for c in ERRORS if issubclass(c, errors.TemporaryError) and not c.spread]
    assert unspread == [errors.CompassDown, errors.FirstContactsBusy, errors.TurnBooked]


# --- Director error classification ---------------------------------------------------------------


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


# --- reconcile plan ------------------------------------------------------------------------------

_AC = frozenset({"application-connector"})


@pytest.mark.parametrize(
    ("mapping", "kyma", "disabled", "expected"),
    [
        (_mapping(compass_id="c"), None, "keep", Unregister("kyma-deleted")),
        (
            _mapping(compass_id="c"),
            KymaView("rt-1", "n", "u", "1", GA, deleting=True, spec_modules=_AC),
            "keep",
            Unregister("kyma-deleted"),
        ),
        # A mapping deleted while its Kyma lives is let go; the runtime stays in Compass.
        (
            _mapping(compass_id="c", deleting=True),
            KymaView("rt-1", "n", "u", "1", GA, spec_modules=_AC),
            "keep",
            Release(),
        ),
        (
            _mapping(compass_id="c", deleting=True),
            KymaView("rt-1", "n", "u", "1", GA, deleting=True, spec_modules=_AC),
            "keep",
            Unregister("kyma-deleted"),
        ),
        # Dropping a runtime from Compass is an explicit operator action.
        (
            dataclasses.replace(_mapping(compass_id="c"), unregister="moved to another landscape"),
            KymaView("rt-1", "n", "u", "1", GA, spec_modules=_AC),
            "keep",
            Unregister("operator"),
        ),
        (_mapping(holder="x", expires=200), None, "keep", Requeue(after=100.5)),
        (
            _mapping(compass_id="c"),
            KymaView("rt-1", "n", "u", "1", GA),
            "unregister",
            Unregister("module-disabled"),
        ),
        (
            _mapping(compass_id="c"),
            KymaView("rt-1", "n", "u", "1", GA),
            "keep",
            SyncLabels({"k": "v"}, {"k": "v"}),
        ),
        (_mapping(), KymaView("rt-1", "n", "u", "1", GA, spec_modules=_AC), "keep", Nothing()),
    ],
)
def test_reconcile_plan(
    mapping: state.Mapping, kyma: KymaView | None, disabled: str, expected: object
) -> None:
    got = plan(
        mapping,
        kyma,
        now=100.0,
        module="application-connector",
        module_required=True,
        disabled_policy=disabled,
        desired_labels={"k": "v"} if kyma else None,
    )
    assert got == expected


def test_backoff_doubles_up_to_cap() -> None:
    assert [backoff(n, base=1, cap=5) for n in (1, 2, 3, 4)] == [1, 2, 4, 5]


# --- logs ----------------------------------------------------------------------------------------


def test_redact_masks_jwts_and_bearer_values() -> None:
    text = (
        'token eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl and "Authorization: Bearer s3cr3t"'
    )
    out = redact(text)
    assert "eyJhbGciOiJSUzI1NiJ9" not in out
    assert "s3cr3t" not in out


def test_a_mapping_keeps_the_whole_object_and_hands_out_copies() -> None:
    obj = {
        "metadata": {"name": "rt-1", "resourceVersion": "7", "labels": {"x": "y"}},
        "spec": {"unknown": {"nested": [1, 2]}},
        "status": {"conditions": [{"type": "Registered", "status": "True"}]},
    }
    mapping = state.Mapping.from_object(obj)
    first = mapping.raw
    assert first == obj
    first["spec"]["unknown"]["nested"].append(3)  # a writer changes its copy ...
    assert mapping.raw == obj  # ... never the cached mapping
