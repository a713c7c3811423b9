"""A simulated fleet: one agent per runtime, each asking the broker with the agent's own client.

Each simulated agent is the real `agent.broker_client.BrokerClient` (the agent's outcome
handling and its tenacity loop over THE retry policy `agent.retry`: capped exponential backoff
with full jitter, `Retry-After` honoured), fed with a bearer token signed by that runtime's key.
All agents share one connection pool to the broker; it holds one connection per agent, so no
agent waits for another on our side.

Holds: an agent is "connected" when the broker answered 201; the run ends when every agent got
an answer that ends a pull (201 or a refusal) or at the deadline, whichever comes first; every
attempt's outcome is counted.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from agent.broker_client import BrokerClient
from agent.outcomes import Issued, Outcome, Refused, Temporary
from agent.retry import DEFAULT_POLICY, RetryPolicy

AGENT_TIMEOUT = 30.0  # the agent's default AGENT_BROKER_TIMEOUT


class StaticIdentity:
    """A projected ServiceAccount token that does not rotate during the run."""

    def __init__(self, token: str) -> None:
        self._authorization = f"Bearer {token}"

    async def authorization(self) -> str | None:
        return self._authorization


def outcome_label(outcome: Outcome) -> str:
    """A short, stable name for an attempt's outcome, for the tallies in the report."""
    if isinstance(outcome, Issued):
        return "201"
    if isinstance(outcome, Refused):
        return f"{outcome.status} {outcome.reason.rsplit(':', 1)[-1]}"
    if outcome.status is None:
        return "transport error" if outcome.reason.startswith("transport") else outcome.reason
    slug = outcome.reason.rsplit(":", 1)[-1] if outcome.reason.startswith("urn:") else ""
    return f"{outcome.status} {slug}".strip()


@dataclass
class FleetResult:
    started_at: float  # wall clock
    connected_at: dict[str, float] = field(default_factory=dict)  # runtime ID -> wall clock
    refused: dict[str, str] = field(default_factory=dict)
    attempts: Counter[str] = field(default_factory=Counter)
    finished_at: float = 0.0
    timed_out: bool = False

    @property
    def connected(self) -> int:
        return len(self.connected_at)


class Fleet:
    def __init__(
        self,
        *,
        broker_url: str,
        tokens: dict[str, str],
        policy: RetryPolicy = DEFAULT_POLICY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._broker_url = broker_url
        self._tokens = tokens
        self._policy = policy
        self._clock = clock

    async def run(
        self,
        runtime_ids: Sequence[str],
        *,
        deadline_seconds: float,
        result: FleetResult | None = None,
    ) -> FleetResult:
        """All agents ask at once; returns when all are done or at the deadline."""
        result = result or FleetResult(started_at=self._clock())
        transport = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(
                max_connections=len(runtime_ids) + 10,
                max_keepalive_connections=len(runtime_ids) + 10,
            )
        )

        async def one(runtime_id: str) -> None:
            client = BrokerClient(
                base_url=self._broker_url,
                identity=StaticIdentity(self._tokens[runtime_id]),
                policy=self._policy,
                timeout=AGENT_TIMEOUT,
                transport=transport,
                clock=lambda: datetime.now(UTC),
            )

            def seen(outcome: Outcome) -> None:
                result.attempts[outcome_label(outcome)] += 1

            # The client's own AsyncClient is not closed: that would close the shared pool.
            outcome = await client.pull(runtime_id, on_attempt=seen)
            if isinstance(outcome, Issued):
                result.connected_at[runtime_id] = self._clock()
            else:
                result.refused[runtime_id] = f"{outcome.status} {outcome.reason}"

        tasks = [asyncio.create_task(one(rid)) for rid in runtime_ids]
        try:
            _, pending = await asyncio.wait(tasks, timeout=deadline_seconds)
            result.timed_out = bool(pending)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await transport.aclose()
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                raise RuntimeError("a simulated agent failed") from task.exception()
        result.finished_at = self._clock()
        return result


__all__ = ["Fleet", "FleetResult", "StaticIdentity", "Temporary", "outcome_label"]
