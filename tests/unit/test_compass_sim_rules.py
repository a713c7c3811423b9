"""Pure rules of the Compass simulator: input validation, label containment, fault
decisions and counter semantics (no network)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from devenv.compass_sim import ErrorCode, Faults, InjectedError, Latency, Outcome, RateLimit
from devenv.compass_sim.faults import FaultState
from devenv.compass_sim.labels import (
    contains,
    is_blank,
    json_path_values,
    label_key_problem,
    matches,
    parse_filters,
    runtime_name_problem,
)
from devenv.compass_sim.recorder import Recorder
from devenv.compass_sim.testing import ManualClock


@pytest.mark.parametrize(
    ("value", "query", "expected"),
    [
        ("abc", "abc", True),
        ("abc", "abcd", False),
        (["abc", "def"], "abc", True),  # an array contains its scalar elements
        (["abc", "def"], ["def"], True),
        (["abc", "def"], ["def", "xyz"], False),
        ({"a": 1, "b": {"c": [1, 2]}}, {"b": {"c": [2]}}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ({"a": [1, 2]}, {"a": 1}, False),  # the scalar exception holds only at the top
        ([[1, 2], 3], [[1]], True),
        ([[1, 2]], [1], False),
        (1, 1.0, True),
        (1, True, False),  # JSON keeps booleans apart from numbers
        (True, True, True),
        ("1", 1, False),
        (None, None, True),
        ({"a": 1}, "a", False),
    ],
)
def test_containment_follows_jsonb(value: object, query: object, expected: bool) -> None:
    assert contains(value, query) is expected


def test_filters_are_anded_and_key_only_means_exists() -> None:
    labels = {"global_subaccount_id": "sa", "region": ["eu", "us"]}
    subaccount = {"key": "global_subaccount_id", "query": '"sa"'}
    assert matches(parse_filters([subaccount, {"key": "region", "query": '"eu"'}]), labels)
    assert not matches(parse_filters([subaccount, {"key": "region", "query": '"asia"'}]), labels)
    assert matches(parse_filters([{"key": "region"}]), labels)
    assert not matches(parse_filters([{"key": "missing"}]), labels)
    assert matches(parse_filters(None), labels)


def test_filter_query_must_be_json() -> None:
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_filters([{"key": "k", "query": "abc"}])


@pytest.mark.parametrize(
    ("query", "values"),
    [
        ('$[*] ? (@ == "kyma")', ("kyma",)),
        ('$[*] ? ( @ == "a b" || @ == "c-d" || @=="e_f" )', ("a b", "c-d", "e_f")),
    ],
)
def test_runtime_type_and_scenarios_filters_take_a_json_path(
    query: str, values: tuple[str, ...]
) -> None:
    assert json_path_values(query) == values
    [runtime_type] = parse_filters([{"key": "runtimeType", "query": query}])
    assert runtime_type.any_of == values
    assert runtime_type.matches({"runtimeType": values[-1]})
    assert runtime_type.matches({"runtimeType": ["zzz", values[0]]})
    assert not runtime_type.matches({"runtimeType": "zzz"})
    assert not runtime_type.matches({"other": values[0]})


@pytest.mark.parametrize("query", ['"kyma"', "$[*]", '$[*] ? (@ == "k/y")'])
def test_a_json_path_filter_of_another_form_is_refused(query: str) -> None:
    with pytest.raises(ValueError, match="value not found"):
        parse_filters([{"key": "runtimeType", "query": query}])


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        # compass-manager's `<shoot>-<random letters>`, upper case included
        ("c-7d3a1b2-AbQxZr", None),
        ("kyma-shoot-XYZQWE", None),
        ("a" * 256, None),
        ("1abc", None),
        ("ab_c", None),
        ("-abc.", None),
        ("a..b", None),
        ("", "cannot be blank"),
        ("a" * 257, "the length must be between 1 and 256"),
        # runes, not bytes: 200 runes are a valid length (400 bytes), but no valid format
        ("é" * 200, "must be in a valid format"),
        ("é" * 257, "the length must be between 1 and 256"),
        ("a b", "must be in a valid format"),
        (" ", "must be in a valid format"),
        ("abc\n", "must be in a valid format"),
        ("a/b", "must be in a valid format"),
        ("a:b", "must be in a valid format"),
    ],
)
def test_runtime_name_rules_are_current_directors(name: str, problem: str | None) -> None:
    assert runtime_name_problem(name) == problem


@pytest.mark.parametrize(
    ("key", "ok"),
    [("global_account_id", True), ("Key9", True), ("bad-key", False), ("", False), ("a.b", False)],
)
def test_label_key_rules(key: str, ok: bool) -> None:
    assert (label_key_problem(key) is None) is ok


@pytest.mark.parametrize(
    ("value", "blank"),
    [
        (None, True),
        ("", True),
        ([], True),
        ({}, True),
        (0, False),  # a json.Number to Director: a string, never empty
        (0.0, False),
        (False, True),
        ("x", False),
        ([0], False),
        ({"a": None}, False),
        (1, False),
        (True, False),
    ],
)
def test_required_label_values(value: object, blank: bool) -> None:
    assert is_blank(value) is blank


class _Rng(random.Random):
    """random() returns the queued values, so rate decisions are exact."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(0)
        self.values = values

    def random(self) -> float:
        return self.values.pop(0)

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.values.pop(0)


def test_down_503_wins_over_rate_limit_and_injected_errors() -> None:
    state = FaultState(
        Faults(
            down="503",
            down_retry_after_seconds=7,
            rate_limit=RateLimit(requests_per_second=1),
            errors=(InjectedError(http_status=500),),
        ),
        rng=_Rng([]),
        clock=ManualClock(0),
    )
    refusal = state.admit("director", ["runtimes"])
    assert refusal is not None
    assert refusal.kind == "unavailable"
    assert (refusal.http_status, refusal.retry_after_seconds) == (503, 7)


def test_rate_limit_is_a_token_bucket_with_retry_after() -> None:
    clock = ManualClock(100.0)
    limit = RateLimit(requests_per_second=0.5, burst=2, endpoints=frozenset({"director"}))
    state = FaultState(Faults(rate_limit=limit), rng=_Rng([]), clock=clock)
    assert state.admit("director", ["runtimes"]) is None
    assert state.admit("director", ["runtimes"]) is None
    refusal = state.admit("director", ["runtimes"])
    assert refusal is not None
    assert (refusal.http_status, refusal.retry_after_seconds) == (429, 2)
    assert state.admit("oauth", ["oauthToken"]) is None  # not limited
    clock.advance(2.0)
    assert state.admit("director", ["runtimes"]) is None
    assert state.admit("director", ["runtimes"]) is not None


def test_counted_and_random_errors() -> None:
    rng = _Rng([0.2, 0.7])
    state = FaultState(
        Faults(
            errors=(
                InjectedError(
                    operation="registerRuntime",
                    error_code=ErrorCode.OPERATION_TIMEOUT,
                    remaining=2,
                ),
                InjectedError(operation="runtimes", rate=0.5),
                InjectedError(operation="runtime", http_status=502),
            )
        ),
        rng=rng,
        clock=ManualClock(0),
    )
    first = state.injected_error("registerRuntime")
    assert first is not None
    assert first.error_code is ErrorCode.OPERATION_TIMEOUT
    assert state.get().errors[0].remaining == 1
    assert state.injected_error("registerRuntime") is not None
    assert state.injected_error("registerRuntime") is None  # used up and removed
    assert len(state.get().errors) == 2
    assert state.injected_error("runtimes") is not None  # 0.2 < 0.5
    assert state.injected_error("runtimes") is None  # 0.7 >= 0.5
    assert state.injected_error("runtime") is None  # HTTP errors fire in admit()
    refusal = state.admit("director", ["runtime"])
    assert refusal is not None
    assert (refusal.kind, refusal.http_status, refusal.operation) == (
        "injected_error",
        502,
        "runtime",
    )


def test_lost_responses_are_consumed_per_operation() -> None:
    state = FaultState(
        Faults(lost_responses={"registerRuntime": 2}, lost_response_mode="drop"),
        rng=_Rng([]),
        clock=ManualClock(0),
    )
    assert state.take_lost_response("unregisterRuntime") is None
    assert state.take_lost_response("registerRuntime") == "drop"
    assert state.get().lost_responses == {"registerRuntime": 1}
    assert state.take_lost_response("registerRuntime") == "drop"
    assert state.take_lost_response("registerRuntime") is None
    assert state.get().lost_responses == {}


def test_latency_is_fixed_plus_jitter_per_endpoint() -> None:
    latency = Latency(fixed_seconds=0.5, jitter_seconds=1.0, endpoints=frozenset({"director"}))
    state = FaultState(Faults(latency=latency), rng=_Rng([0.25]), clock=ManualClock(0))
    assert state.delay("director") == pytest.approx(0.75)
    assert state.delay("oauth") == 0.0


def test_faults_reject_unknown_operations_and_fields() -> None:
    with pytest.raises(ValueError, match="unknown operation"):
        Faults(lost_responses={"registerRuntimes": 1})
    with pytest.raises(ValueError, match="unknown operation"):
        InjectedError(operation="nope")
    with pytest.raises(ValueError, match="Extra inputs"):
        Faults.model_validate({"dwon": "503"})


def test_counters_separate_attempts_successes_and_failures() -> None:
    recorder = Recorder(log_size=3)
    at = datetime.now(UTC)
    for outcome, codes in [
        (Outcome.OK, ()),
        (Outcome.ERROR, (22,)),
        (Outcome.INJECTED_ERROR, (10,)),
        (Outcome.LOST_RESPONSE, ()),
        (Outcome.RATE_LIMITED, ()),
    ]:
        recorder.record(
            at=at,
            endpoint="director",
            operation="registerRuntime",
            tenant="t",
            outcome=outcome,
            http_status=200,
            error_codes=codes,
            duration_seconds=0.0,
        )
    counter = recorder.counters()["registerRuntime"]
    assert (counter.attempts, counter.successes, counter.errors) == (5, 2, 3)
    assert (counter.injected_errors, counter.lost_responses, counter.rate_limited) == (1, 1, 1)
    assert [r.seq for r in recorder.requests()] == [3, 4, 5]  # the log is bounded
    assert [r.outcome for r in recorder.requests(since_seq=4)] == [Outcome.RATE_LIMITED]
