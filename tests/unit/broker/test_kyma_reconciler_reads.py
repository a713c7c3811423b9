"""What the reconciler reads from the API server: nothing while it has nothing to act on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from control_plane_broker.metrics import Metrics
from control_plane_broker.reconciler.kyma_reconciler import KymaReconciler
from control_plane_broker.registration import state
from control_plane_broker.settings import Settings
from tests.unit.broker.mapping_views import mapping_view
from tests.unit.broker.virtual_time import run_virtually


class _View:
    def __init__(self, items: dict[str, object]) -> None:
        self._items = items
        self.synced = True

    def get(self, name: str) -> object | None:
        return self._items.get(name)

    def add_listener(self, listener: Callable[[str], None]) -> None:
        pass


class _NoReads:
    async def get(self, name: str) -> state.Mapping | None:
        raise AssertionError(f"read {name} although nothing was to be done")


def test_a_registration_in_flight_is_looked_at_again_later_without_a_read() -> None:
    """On virtual time (tests/unit/broker/virtual_time.py): the re-queue is due exactly when
    the claim has expired plus half a second, 0.55 s after the reconcile."""
    now = 100.0
    claimed = mapping_view(holder="other-replica", expires=now + 0.05)

    async def scenario() -> None:
        reconciler = KymaReconciler(
            settings=Settings().reconciler_settings(),
            cache=_View({}),  # type: ignore[arg-type]
            mappings=_View({"rt-1": claimed}),  # type: ignore[arg-type]
            repo=_NoReads(),  # type: ignore[arg-type]
            director=None,  # type: ignore[arg-type]
            registration=None,  # type: ignore[arg-type]
            events=None,  # type: ignore[arg-type]
            status=None,  # type: ignore[arg-type]
            metrics=Metrics(),
            leading=lambda: True,
            clock=lambda: now,
        )
        await reconciler.reconcile("rt-1")
        # queued again once the claim has expired (plus half a second), not before
        await asyncio.sleep(0.54)
        assert reconciler._queue.empty()
        await asyncio.sleep(0.02)
        assert reconciler._queue.get_nowait() == "rt-1"

    run_virtually(scenario())
