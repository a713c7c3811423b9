"""Protects Director: a circuit breaker and a global concurrency limit around every call.

Holds: while the breaker is open no call leaves the process, also none that was already waiting
for a slot when it opened; at most `max_concurrency` calls are in flight; a caller that waits
longer than `queue_timeout` for a slot gets `CompassUnavailable`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from control_plane_broker import circuit_breaker as cb
from control_plane_broker.director.errors import DirectorRetryable
from control_plane_broker.errors import CompassUnavailable

T = TypeVar("T")


class DirectorGuard:
    def __init__(
        self,
        *,
        policy: cb.BreakerPolicy,
        max_concurrency: int,
        queue_timeout: float,
        clock: Callable[[], float],
        on_state: Callable[[str], None] | None = None,
    ) -> None:
        self._policy = policy
        self._breaker = cb.Breaker()
        self._slots = asyncio.Semaphore(max_concurrency)
        self._queue_timeout = queue_timeout
        self._clock = clock
        self._on_state = on_state

    @property
    def state(self) -> cb.State:
        return self._breaker.state

    def _set(self, breaker: cb.Breaker) -> None:
        if breaker.state is not self._breaker.state and self._on_state is not None:
            self._on_state(breaker.state.value)
        self._breaker = breaker

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        breaker, admission = cb.admit(self._breaker, self._policy, self._clock())
        self._set(breaker)
        if not admission.allowed:
            raise CompassUnavailable("circuit breaker open", retry_after=admission.retry_after)
        probe = breaker.state is cb.State.HALF_OPEN
        verdict: bool | None = None  # True healthy, False outage, None no verdict
        try:
            try:
                await asyncio.wait_for(self._slots.acquire(), self._queue_timeout)
            except TimeoutError:
                raise CompassUnavailable(
                    "too many Director calls in flight", retry_after=1.0
                ) from None
            try:
                if not cb.may_leave_queue(self._breaker, probe=probe):
                    raise CompassUnavailable(
                        "circuit breaker opened while the call waited for a slot",
                        retry_after=cb.seconds_until_probe(
                            self._breaker, self._policy, self._clock()
                        ),
                    )
                result = await fn()
            finally:
                self._slots.release()
            verdict = True
            return result
        except DirectorRetryable:
            verdict = False
            raise
        except CompassUnavailable:
            raise  # our own queue timeout: no verdict on Director
        except Exception:
            verdict = True  # a permanent answer: Director is up and talking
            raise
        finally:
            self._settle(verdict, probe=probe)

    def _settle(self, verdict: bool | None, *, probe: bool) -> None:
        if verdict is False:
            self._set(cb.record_failure(self._breaker, self._policy, self._clock()))
        elif verdict is True and self._breaker.state is not cb.State.OPEN:
            self._set(cb.record_success(self._breaker))
        elif verdict is None and probe and self._breaker.state is cb.State.HALF_OPEN:
            # The probe was cancelled or timed out in the queue: let the next caller probe.
            self._set(cb.release_probe(self._breaker))
