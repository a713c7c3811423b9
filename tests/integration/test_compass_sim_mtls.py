"""Compass simulator, certificate-secured side: after the token exchange a runtime reaches the
Connector and Director with its client certificate only, and sees nothing but itself."""

from __future__ import annotations

import base64
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devenv import pki
from devenv.compass_sim import CompassSimulator, SimConfig
from devenv.compass_sim.ca import load_csr
from devenv.compass_sim.mtls import CertificateSecuredCompass
from devenv.compass_sim.testing import (
    REQUEST_ONE_TIME_TOKEN,
    DirectorClient,
    build_csr,
    parse_subject,
)

pytestmark = pytest.mark.timeout(60)

TENANT = "global-account-1"
# The agent's query, field for field (compass-runtime-agent 859cac3, director/query.go).
APPS_AND_LABELS = """query {
  runtime(id: "%(id)s") { labels }
  applicationsForRuntime(runtimeID: "%(id)s") {
    data {
      id name providerName description labels auths { id }
      bundles {
        data {
          id name description instanceAuthRequestInputSchema
          apiDefinitions { data { id name description targetURL group
              version { value deprecated deprecatedSince forRemoval } }
            pageInfo { startCursor endCursor hasNextPage } totalCount }
          eventDefinitions { data { id name description group
              version { value deprecated deprecatedSince forRemoval } }
            pageInfo { startCursor endCursor hasNextPage } totalCount }
          defaultInstanceAuth {
            credential {
              ... on BasicCredentialData { username password }
              ... on OAuthCredentialData { clientId clientSecret url }
            }
            additionalHeaders additionalQueryParams
            requestAuth { csrf { tokenEndpointURL } }
          }
        }
        pageInfo { startCursor endCursor hasNextPage } totalCount
      }
    }
    pageInfo { startCursor endCursor hasNextPage } totalCount
  }
}"""
CONFIGURATION = """query { result: configuration {
  token { token } certificateSigningRequestInfo { subject keyAlgorithm }
  managementPlaneInfo { directorURL certificateSecuredConnectorURL } } }"""


@pytest.fixture(scope="module")
def compass() -> Iterator[tuple[CompassSimulator, CertificateSecuredCompass]]:
    sim = CompassSimulator(SimConfig(client_id="id", client_secret="secret"))
    with sim.running(), CertificateSecuredCompass(sim) as secured:
        yield sim, secured


def _system_auth(sim: CompassSimulator, runtime_id: str) -> str:
    """A SystemAuth of the runtime (Director makes one per one-time token): what the CN of the
    certificate Connector signs for it names."""
    runtime = sim.runtime(runtime_id)
    assert runtime is not None
    with httpx.Client(timeout=10) as http:
        director = DirectorClient(
            http, sim.director_url, token=sim.issue_access_token(), tenant=runtime.tenant
        )
        director.result(REQUEST_ONE_TIME_TOKEN, {"id": runtime_id})
    newest = max(sim.connector_tokens(runtime_id), key=lambda t: t.created_at)
    return newest.system_auth_id


def _client(sim: CompassSimulator, runtime_id: str, folder: Path) -> httpx.Client:
    """A client with a certificate as Connector signs it for the runtime's SystemAuth."""
    auth_id = _system_auth(sim, runtime_id)
    csr, key = build_csr(parse_subject(sim.config.csr_subject.render(auth_id)))
    certificate = sim.ca.sign(load_csr(base64.b64decode(csr)))
    (folder / "tls.crt").write_bytes(certificate)
    (folder / "tls.key").write_bytes(pki.private_key_pem(key))
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the agent runs with APP_SKIP_COMPASS_TLS_VERIFY
    context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
    return httpx.Client(verify=context, timeout=10)


def test_runtime_syncs_over_mtls_and_sees_only_itself(
    compass: tuple[CompassSimulator, CertificateSecuredCompass], tmp_path: Path
) -> None:
    sim, secured = compass
    mine = sim.seed_runtime(tenant=TENANT, name="mine")
    other = sim.seed_runtime(tenant=TENANT, name="other")
    before = secured.calls()
    with _client(sim, mine.id, tmp_path) as client:
        configuration = client.post(
            f"{secured.url}/connector/graphql", json={"query": CONFIGURATION}
        ).json()["data"]["result"]
        assert configuration["managementPlaneInfo"] == {
            "directorURL": f"{secured.url}/director/graphql",
            "certificateSecuredConnectorURL": f"{secured.url}/connector/graphql",
        }
        subject = configuration["certificateSigningRequestInfo"]["subject"]
        assert (
            parse_subject(subject)["CN"]
            == max(sim.connector_tokens(mine.id), key=lambda t: t.created_at).system_auth_id
        )

        director = f"{secured.url}/director/graphql"
        answer = client.post(
            director, json={"query": APPS_AND_LABELS % {"id": mine.id}}, headers={"Tenant": TENANT}
        ).json()
        assert "errors" not in answer
        assert answer["data"]["applicationsForRuntime"]["data"] == []
        assert answer["data"]["runtime"] == {"labels": {}}

        label = (
            'mutation { setRuntimeLabel(runtimeID: "%s", key: "runtime_consoleUrl",'
            ' value: "https://c") { key value } }'
        )
        set_answer = client.post(
            director, json={"query": label % mine.id}, headers={"Tenant": TENANT}
        ).json()
        assert set_answer["data"]["setRuntimeLabel"] == {
            "key": "runtime_consoleUrl",
            "value": "https://c",
        }
        stored = sim.runtime(mine.id)
        assert stored is not None
        assert stored.labels["runtime_consoleUrl"] == "https://c"

        for runtime_id, tenant in ((other.id, TENANT), (mine.id, "another-tenant")):
            refused = client.post(
                director,
                json={"query": APPS_AND_LABELS % {"id": runtime_id}},
                headers={"Tenant": tenant},
            ).json()
            assert refused["data"] is None
            assert refused["errors"][0]["extensions"]["error"] == "NotFound"
    calls = secured.calls()
    assert calls["applicationsForRuntime"] - before.get("applicationsForRuntime", 0) == 3
    assert calls["setRuntimeLabel"] - before.get("setRuntimeLabel", 0) == 1


def test_a_runtime_registered_in_a_subaccount_is_seen_from_its_global_account(
    compass: tuple[CompassSimulator, CertificateSecuredCompass], tmp_path: Path
) -> None:
    """The broker registers in the subaccount; the runtime's Secret names the global account."""
    sim, secured = compass
    token = httpx.post(
        sim.token_url,
        data={"grant_type": "client_credentials", "scope": "runtime:read runtime:write"},
        auth=("id", "secret"),
    ).json()["access_token"]
    registered = httpx.post(
        sim.director_url,
        headers={"Authorization": f"Bearer {token}", "Tenant": TENANT},
        json={
            "query": "mutation($in: RuntimeRegisterInput!) { registerRuntime(in: $in) { id } }",
            "variables": {"in": {"name": "in-sa", "labels": {"global_subaccount_id": "sa-1"}}},
        },
    ).json()["data"]["registerRuntime"]["id"]
    stored = sim.runtime(registered)
    assert stored is not None
    assert stored.tenant == "sa-1"  # owned by the subaccount
    with _client(sim, registered, tmp_path) as client:
        answer = client.post(
            f"{secured.url}/director/graphql",
            json={"query": APPS_AND_LABELS % {"id": registered}},
            headers={"Tenant": TENANT},
        ).json()
    assert "errors" not in answer, answer
    assert answer["data"]["applicationsForRuntime"]["data"] == []


def test_without_a_certificate_from_the_connector_nothing_gets_through(
    compass: tuple[CompassSimulator, CertificateSecuredCompass],
) -> None:
    _, secured = compass
    stranger = pki.new_ca("stranger")
    pair = pki.issue(stranger, common_name="someone", client=True)
    for verify in (_insecure(), _insecure(pair)):
        with pytest.raises(httpx.TransportError):
            httpx.post(
                f"{secured.url}/director/graphql", json={"query": "{ x }"}, verify=verify, timeout=5
            )


def _insecure(pair: pki.KeyPair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if pair is not None:
        with tempfile.TemporaryDirectory() as folder:
            cert, key = Path(folder, "c"), Path(folder, "k")
            cert.write_bytes(pair.cert_pem)
            key.write_bytes(pair.key_pem)
            context.load_cert_chain(cert, key)
    return context


def test_the_connector_hands_out_the_certificate_secured_urls_while_serving(
    compass: tuple[CompassSimulator, CertificateSecuredCompass],
) -> None:
    sim, secured = compass
    assert sim.certificate_secured == secured.urls()
    answer = httpx.post(
        sim.connector_url, json={"query": CONFIGURATION}, headers={"Connector-Token": "spent"}
    )
    # The token-secured Connector still wants a token: HTTP 400, empty, as Compass's.
    assert (answer.status_code, answer.content) == (400, b"")
