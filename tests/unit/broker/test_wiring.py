"""The composition root's factories: every resource they make is closed when the broker stops,
even when closing another one fails."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest

from control_plane_broker import wiring
from control_plane_broker.kube.runtime_access import RuntimeAccess
from control_plane_broker.metrics import Metrics
from control_plane_broker.overload.deferred_writes import DeferredWrites
from control_plane_broker.settings import DirectorCredentials, Settings
from kubeapi import ClusterAccess

CREDENTIALS = DirectorCredentials(
    client_id="c", client_secret="s", tokens_endpoint="https://oauth.test/token"
)


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[httpx.AsyncClient]:
    """Every httpx client created while the test runs."""
    clients: list[httpx.AsyncClient] = []

    class Recorded(httpx.AsyncClient):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            clients.append(self)

    monkeypatch.setattr(httpx, "AsyncClient", Recorded)
    return clients


async def build(settings: Settings, *, then: Exception | None = None) -> None:
    """The KCP, Director and identity parts on one stack, as `wiring.run` builds them; `then`
    is raised after them, as a later start-up step would."""
    metrics = Metrics()
    async with AsyncExitStack() as stack:
        _, limiter, _ = wiring.director_side(settings, CREDENTIALS, stack=stack, metrics=metrics)
        kcp = wiring.control_plane(
            settings,
            ClusterAccess(server="https://kcp.test"),
            stack=stack,
            me="replica",
            metrics=metrics,
            deferred=DeferredWrites(busy=limiter.backlogged),
        )
        wiring.identity(settings, kcp=kcp, stack=stack, metrics=metrics)
        if then is not None:
            raise then


@pytest.mark.parametrize("mode", ["tokenreview", "jwks", "xfcc"])
async def test_a_close_that_fails_does_not_keep_the_others_from_closing(
    made: list[httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    async def broken(_self: RuntimeAccess) -> None:
        raise RuntimeError("close failed")

    monkeypatch.setattr(RuntimeAccess, "aclose", broken)
    settings = Settings(
        director_url="https://director.test/graphql", identity_mode=mode, byoc_enrolment=True
    )
    with pytest.raises(RuntimeError, match="close failed"):
        await build(settings)
    # Director, OAuth, KCP, issuer keys: the KCP client closes after the failed one.
    assert len(made) == 4
    assert all(client.is_closed for client in made)


async def test_start_up_that_fails_closes_what_it_made(made: list[httpx.AsyncClient]) -> None:
    settings = Settings(director_url="https://director.test/graphql")
    with pytest.raises(SystemExit):
        await build(settings, then=SystemExit("BROKER_XFCC_DENY_LIST_FILE: unreadable"))
    assert len(made) == 4
    assert all(client.is_closed for client in made)


async def test_byoc_enrolment_builds_one_jwks_verifier(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[object] = []
    real = wiring.JwksVerifier

    def counting(*args: Any, **kwargs: Any) -> object:
        verifier = real(*args, **kwargs)
        built.append(verifier)
        return verifier

    monkeypatch.setattr(wiring, "JwksVerifier", counting)
    for mode, expected in (("tokenreview", 1), ("jwks", 1), ("xfcc", 0)):
        built.clear()
        settings = Settings(identity_mode=mode, byoc_enrolment=True)
        await build(settings)
        assert len(built) == expected, mode
