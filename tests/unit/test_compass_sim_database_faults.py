"""Decisions of the Compass simulator's database faults (no network): how `Faults` reads them,
how counted and random ones are used up, the order of `database_down`'s answers, and the
command-line flags that set them at start."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from devenv.compass_sim import Faults
from devenv.compass_sim.__main__ import build_parser, faults_from_args
from devenv.compass_sim.faults import AfterCommit, DatabaseAnswer, FaultState
from devenv.compass_sim.testing import ManualClock


class _Rng(random.Random):
    """random() returns the queued values, so rate decisions are exact."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(0)
        self.values = values

    def random(self) -> float:
        return self.values.pop(0)


def _state(faults: Faults, rng: list[float] | None = None) -> FaultState:
    return FaultState(faults, rng=_Rng(rng or []), clock=ManualClock(0))


def test_a_plain_count_is_a_counted_fault_and_zero_is_none() -> None:
    faults = Faults(
        commit_then_error={"registerRuntime": 2, "setRuntimeLabel": 0},
        field_error_after_commit={"registerRuntime": {"rate": 0.25}},
    )
    assert faults.commit_then_error == {"registerRuntime": AfterCommit(remaining=2)}
    assert faults.field_error_after_commit == {"registerRuntime": AfterCommit(rate=0.25)}
    assert Faults.model_validate(faults.model_dump(mode="json")) == faults


@pytest.mark.parametrize(
    "fields",
    [
        {"commit_then_error": {"runtimes": 1}},  # a query commits nothing
        {"commit_then_error": {"registerRuntimes": 1}},
        {"commit_then_error": {"*": 1}},
        {"commit_then_error": {"registerRuntime": -1}},
        {"commit_then_error": {"registerRuntime": {"rate": 1.5}}},
        {"field_error_after_commit": {"setRuntimeLabel": 1}},  # answers a Label, not a Runtime
        {"field_error_after_commit": {"requestOneTimeTokenForRuntime": 1}},
        {"database_down": "often"},
    ],
)
def test_faults_refuse_what_director_cannot_do(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Faults.model_validate(fields)


def test_counted_commit_errors_are_used_up_per_operation() -> None:
    state = _state(Faults(commit_then_error={"registerRuntime": 2, "unregisterRuntime": 1}))
    assert state.take_commit_error("setRuntimeLabel") is False
    assert state.take_commit_error("registerRuntime") is True
    assert state.get().commit_then_error["registerRuntime"].remaining == 1
    assert state.take_commit_error("registerRuntime") is True
    assert state.take_commit_error("registerRuntime") is False
    assert state.get().commit_then_error == {"unregisterRuntime": AfterCommit(remaining=1)}
    assert state.take_field_error("unregisterRuntime") is False  # another fault's entry
    assert state.take_commit_error("unregisterRuntime") is True
    assert state.get().commit_then_error == {}


def test_random_field_errors_follow_their_rate_and_last() -> None:
    state = _state(
        Faults(field_error_after_commit={"registerRuntime": {"rate": 0.5}}), rng=[0.2, 0.7, 0.4]
    )
    assert [state.take_field_error("registerRuntime") for _ in range(3)] == [True, False, True]
    assert state.get().field_error_after_commit == {"registerRuntime": AfterCommit(rate=0.5)}


def test_database_down_answers_in_turn_per_operation_and_restarts_when_set() -> None:
    state = _state(Faults(database_down=True))
    internal, bad, tenant = (
        DatabaseAnswer.INTERNAL,
        DatabaseAnswer.BAD_CONNECTION,
        DatabaseAnswer.TENANT_ACCESS,
    )
    register = [state.database_answer("registerRuntime") for _ in range(4)]
    assert register == [internal, bad, tenant, internal]
    unregister = [state.database_answer("unregisterRuntime") for _ in range(3)]
    assert unregister == [internal, bad, internal]
    assert [state.database_answer("setRuntimeLabel") for _ in range(3)] == [internal, bad, tenant]
    assert state.database_answer("registerRuntime") == bad  # its own turn went on

    state.replace(Faults(database_down=True))
    assert state.database_answer("registerRuntime") == internal
    state.replace(Faults())
    assert state.database_answer("registerRuntime") is None


def test_command_line_flags_set_the_database_faults() -> None:
    args = build_parser().parse_args(
        [
            "--client-id",
            "id",
            "--commit-then-error",
            "registerRuntime:3",
            "--commit-then-error",
            "setRuntimeLabel",
            "--field-error-after-commit",
            "registerRuntime",
            "--database-down",
        ]
    )
    faults = faults_from_args(args)
    assert faults.commit_then_error == {
        "registerRuntime": AfterCommit(remaining=3),
        "setRuntimeLabel": AfterCommit(remaining=1),
    }
    assert faults.field_error_after_commit == {"registerRuntime": AfterCommit(remaining=1)}
    assert faults.database_down is True
    plain = faults_from_args(build_parser().parse_args(["--client-id", "id"]))
    assert (plain.commit_then_error, plain.field_error_after_commit, plain.database_down) == (
        {},
        {},
        False,
    )
