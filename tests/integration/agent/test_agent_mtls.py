"""mTLS identity: the agent presents its client certificate to a broker endpoint that requires
and verifies one, verifies the broker against AGENT_BROKER_CA_BUNDLE, and picks up a rotated
certificate without a restart. Real runtime API server; the broker is the scripted FakeBroker
behind TLS (the real broker's mTLS termination is tested with the broker)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.integration.agent.conftest import (
    AgentEnv,
    FakeBroker,
    Pki,
    eventually,
    mtls_server_context,
    token_reply,
)


def attempts(agent: object, outcome: str) -> float:
    registry = agent.metrics.registry  # type: ignore[attr-defined]
    value = registry.get_sample_value("compass_agent_pull_attempts_total", {"outcome": outcome})
    return float(value or 0.0)


@dataclass
class MtlsSetup:
    folder: Path  # broker-ca.crt (signed the broker), stranger-ca.crt (did not)
    client_ca: Pki  # the CA the broker trusts for client certificates
    server: ssl.SSLContext  # the broker's: requires a client certificate from client_ca


@pytest.fixture
def pki(tmp_path: Path) -> MtlsSetup:
    server_ca, client_ca, stranger_ca = Pki("broker-ca"), Pki("watcher-ca"), Pki("stranger-ca")
    folder = tmp_path / "pki"
    folder.mkdir()
    (folder / "broker-ca.crt").write_bytes(server_ca.cert_pem)
    (folder / "stranger-ca.crt").write_bytes(stranger_ca.cert_pem)
    return MtlsSetup(folder, client_ca, mtls_server_context(folder, server_ca, client_ca))


async def test_mtls_presents_the_client_certificate_and_picks_up_a_rotated_one(
    agent_env: AgentEnv, pki: MtlsSetup
) -> None:
    folder, client_ca = pki.folder, pki.client_ca
    cert_file, key_file = folder / "tls.crt", folder / "tls.key"
    client_ca.issue(agent_env.runtime_id, server=False).write(cert_file, key_file)
    broker = FakeBroker(token_reply, tls=pki.server)
    await broker.start()
    try:
        # The endpoint really requires a client certificate: without one nothing gets through.
        bare = ssl.create_default_context(cafile=str(folder / "broker-ca.crt"))
        async with httpx.AsyncClient(verify=bare, timeout=10) as http:
            with pytest.raises(httpx.TransportError):
                await http.post(f"{broker.url}/v1/runtimes/x/token", json={})
        assert broker.requests == []

        settings = agent_env.settings(
            broker.url,
            identity_mode="mtls",
            broker_ca_bundle=folder / "broker-ca.crt",
            client_cert_file=cert_file,
            client_key_file=key_file,
        )
        agent = await agent_env.start(settings)
        agent_env.put_kyma(modules=["application-connector"])
        data = await eventually(agent_env.secret_data, within=20, what="the token secret")
        assert data["TOKEN"] == "ott-1"
        assert broker.peers == [agent_env.runtime_id]  # the certificate was on the connection
        assert "authorization" not in broker.requests[0][2]  # and no bearer token was sent

        # Rotation: a new certificate in the same files is presented on the next connection.
        client_ca.issue("rotated-" + agent_env.runtime_id, server=False).write(cert_file, key_file)
        agent_env.cluster.core.delete_namespaced_secret(
            "compass-agent-configuration", agent_env.namespace
        )
        await eventually(
            lambda: (agent_env.secret_data() or {}).get("TOKEN") == "ott-2", what="token 2"
        )
        assert broker.peers == [agent_env.runtime_id, "rotated-" + agent_env.runtime_id]
        assert attempts(agent, "temporary") == 0
    finally:
        await agent_env.stop_all()
        await broker.stop()


async def test_mtls_with_the_wrong_ca_bundle_fails_and_keeps_retrying(
    agent_env: AgentEnv, pki: MtlsSetup
) -> None:
    folder, client_ca = pki.folder, pki.client_ca
    cert_file, key_file = folder / "tls.crt", folder / "tls.key"
    client_ca.issue(agent_env.runtime_id, server=False).write(cert_file, key_file)
    broker = FakeBroker(token_reply, tls=pki.server)
    await broker.start()
    try:
        settings = agent_env.settings(
            broker.url,
            identity_mode="mtls",
            broker_ca_bundle=folder / "stranger-ca.crt",  # did not sign the broker's certificate
            client_cert_file=cert_file,
            client_key_file=key_file,
            backoff_base=0.2,
            backoff_cap=1.0,
        )
        agent = await agent_env.start(settings)
        agent_env.put_kyma(modules=["application-connector"])
        # Temporary outcomes, retried (not given up, not a refusal).
        await eventually(
            lambda: attempts(agent, "temporary") >= 3, within=20, what="three failed attempts"
        )
        assert attempts(agent, "issued") == attempts(agent, "refused") == 0
        assert agent_env.secret() is None
        assert broker.requests == []  # no request ever reached the broker
        assert agent_env.events("TokenPulled") == []
        assert agent_env.events("PullRefused") == []
    finally:
        await agent_env.stop_all()
        await broker.stop()
