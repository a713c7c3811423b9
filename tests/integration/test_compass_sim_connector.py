"""Compass simulator, Connector: one-time token -> configuration -> signed client
certificate, with single use, expiry and subject checks, through HTTP. A token that names no
one is HTTP 400 with an empty body, as Compass's chain answers
(`real_director/test_connector_contract.py` holds the simulator to the real Connector)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devenv.compass_sim import CompassSimulator, CsrSubject, SimConfig, TokenKind
from devenv.compass_sim.testing import (
    CONNECTOR_CONFIGURATION,
    REGISTER_RUNTIME,
    REQUEST_ONE_TIME_TOKEN,
    SIGN_CSR,
    UNREGISTER_RUNTIME,
    DirectorClient,
    ManualClock,
    build_csr,
    parse_subject,
)

pytestmark = pytest.mark.timeout(60)

TENANT = "global-account-1"
OTT_TTL = 600
CSR_TTL = 60
SUBJECT = CsrSubject(
    organization="Org",
    organizational_unit="OrgUnit",
    locality="Town",
    province="Land",
    country="PL",
)


@pytest.fixture(scope="module")
def sim(clock: ManualClock) -> Iterator[CompassSimulator]:
    config = SimConfig(
        client_id="id",
        client_secret="secret",
        ott_ttl_seconds=OTT_TTL,
        csr_token_ttl_seconds=CSR_TTL,
        csr_subject=SUBJECT,
    )
    with CompassSimulator(config, clock=clock).running() as simulator:
        yield simulator


@pytest.fixture(scope="module")
def key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(autouse=True)
def _fresh(sim: CompassSimulator) -> None:
    sim.reset()


@pytest.fixture
def director(sim: CompassSimulator, http: httpx.Client) -> DirectorClient:
    return DirectorClient(http, sim.director_url, token=sim.issue_access_token(), tenant=TENANT)


def _new_runtime(director: DirectorClient, name: str = "kyma") -> str:
    runtime_id: str = director.result(REGISTER_RUNTIME, {"in": {"name": name}})["id"]
    return runtime_id


def _one_time_token(director: DirectorClient, runtime_id: str) -> str:
    token: str = director.result(REQUEST_ONE_TIME_TOKEN, {"id": runtime_id})["token"]
    return token


def _connector(
    sim: CompassSimulator,
    http: httpx.Client,
    query: str,
    token: str | None,
    variables: dict[str, Any] | None = None,
) -> httpx.Response:
    headers = {"Connector-Token": token} if token is not None else {}
    return http.post(
        sim.connector_url, json={"query": query, "variables": variables or {}}, headers=headers
    )


def _refused(response: httpx.Response) -> None:
    """Refused as Compass refuses a token that names no one: nothing says why."""
    assert response.status_code == 400
    assert response.content == b""
    assert response.headers["content-type"] == "application/json;charset=UTF-8"


def _auth_id(sim: CompassSimulator, runtime_id: str, kind: TokenKind = TokenKind.ONE_TIME) -> str:
    """The SystemAuth holding the runtime's (one) token of that kind: the certificate's CN."""
    [token] = [t for t in sim.connector_tokens(runtime_id) if t.kind is kind]
    return token.system_auth_id


def test_one_time_token_is_exchanged_for_a_client_certificate(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient, key: rsa.RSAPrivateKey
) -> None:
    runtime_id = _new_runtime(director)
    response = _connector(sim, http, CONNECTOR_CONFIGURATION, _one_time_token(director, runtime_id))
    assert response.status_code == 200
    configuration = response.json()["data"]["result"]
    info = configuration["certificateSigningRequestInfo"]
    # Named after the SystemAuth holding Director's token, as Compass names it: not the runtime.
    auth_id = _auth_id(sim, runtime_id)
    assert auth_id not in ("", runtime_id)
    assert info["subject"] == f"O=Org,OU=OrgUnit,L=Town,ST=Land,C=PL,CN={auth_id}"
    assert info["keyAlgorithm"] == "rsa2048"
    assert configuration["managementPlaneInfo"] == {
        "directorURL": sim.director_url,
        "certificateSecuredConnectorURL": sim.connector_url,
    }
    csr_token = configuration["token"]["token"]
    assert len(base64.urlsafe_b64decode(csr_token)) == 64

    csr, _ = build_csr(parse_subject(info["subject"]), key)
    signed = _connector(sim, http, SIGN_CSR, csr_token, {"csr": csr})
    assert signed.status_code == 200, signed.text
    result = signed.json()["data"]["result"]
    client_pem = base64.b64decode(result["clientCertificate"])
    ca_pem = base64.b64decode(result["caCertificate"])
    assert base64.b64decode(result["certificateChain"]) == client_pem + ca_pem
    client = x509.load_pem_x509_certificate(client_pem)
    ca = x509.load_pem_x509_certificate(ca_pem)
    client.verify_directly_issued_by(ca)
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == auth_id
    # The CSR's subject, in the order Go writes a name (C, ST, L, O, OU, CN).
    assert client.subject.rfc4514_string() == (f"CN={auth_id},OU=OrgUnit,O=Org,L=Town,ST=Land,C=PL")
    client_key = client.public_key()
    assert isinstance(client_key, rsa.RSAPublicKey)
    assert client_key.public_numbers() == key.public_key().public_numbers()
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage
    assert sim.counter("configuration").successes == 1
    assert sim.counter("signCertificateSigningRequest").successes == 1


def test_one_time_token_can_be_used_once(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient
) -> None:
    runtime_id = _new_runtime(director)
    token = _one_time_token(director, runtime_id)
    assert _connector(sim, http, CONNECTOR_CONFIGURATION, token).json().get("errors") is None
    _refused(_connector(sim, http, CONNECTOR_CONFIGURATION, token))
    [ott] = [t for t in sim.connector_tokens(runtime_id) if t.kind is TokenKind.ONE_TIME]
    assert ott.used


def test_expired_one_time_token_is_refused(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient, clock: ManualClock
) -> None:
    runtime_id = _new_runtime(director)
    still_valid = _one_time_token(director, runtime_id)
    expiring = _one_time_token(director, runtime_id)
    clock.advance(OTT_TTL - 1)
    assert _connector(sim, http, CONNECTOR_CONFIGURATION, still_valid).json().get("errors") is None
    clock.advance(1)
    _refused(_connector(sim, http, CONNECTOR_CONFIGURATION, expiring))


@pytest.mark.parametrize("token", [None, "", "bm90LWEtdG9rZW4="])
def test_missing_or_unknown_token_is_refused(
    sim: CompassSimulator, http: httpx.Client, token: str | None
) -> None:
    _refused(_connector(sim, http, CONNECTOR_CONFIGURATION, token))


def test_token_of_an_unregistered_runtime_is_refused(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient
) -> None:
    runtime_id = _new_runtime(director)
    token = _one_time_token(director, runtime_id)
    director.result(UNREGISTER_RUNTIME, {"id": runtime_id})
    _refused(_connector(sim, http, CONNECTOR_CONFIGURATION, token))


def test_tokens_are_bound_to_their_runtime(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient
) -> None:
    first, second = _new_runtime(director, "first"), _new_runtime(director, "second")
    token_first, token_second = _one_time_token(director, first), _one_time_token(director, second)
    for token, runtime_id in [(token_second, second), (token_first, first)]:
        configuration = _connector(sim, http, CONNECTOR_CONFIGURATION, token).json()
        subject = configuration["data"]["result"]["certificateSigningRequestInfo"]["subject"]
        assert parse_subject(subject)["CN"] == _auth_id(sim, runtime_id)
    [csr_token] = [t for t in sim.connector_tokens(first) if t.kind is TokenKind.CSR]
    # On the same SystemAuth as Director's token.
    assert (csr_token.runtime_id, csr_token.tenant, csr_token.system_auth_id) == (
        first,
        TENANT,
        _auth_id(sim, first),
    )


def _csr_token_and_subject(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient
) -> tuple[str, dict[str, str]]:
    token = _one_time_token(director, _new_runtime(director))
    configuration = _connector(sim, http, CONNECTOR_CONFIGURATION, token).json()["data"]["result"]
    subject = parse_subject(configuration["certificateSigningRequestInfo"]["subject"])
    return configuration["token"]["token"], subject


def test_csr_token_can_be_used_once_and_expires(
    sim: CompassSimulator,
    http: httpx.Client,
    director: DirectorClient,
    key: rsa.RSAPrivateKey,
    clock: ManualClock,
) -> None:
    csr_token, subject = _csr_token_and_subject(sim, http, director)
    csr, _ = build_csr(subject, key)
    assert _connector(sim, http, SIGN_CSR, csr_token, {"csr": csr}).json().get("errors") is None
    _refused(_connector(sim, http, SIGN_CSR, csr_token, {"csr": csr}))

    late_token, subject = _csr_token_and_subject(sim, http, director)
    clock.advance(CSR_TTL)
    late_csr, _ = build_csr(subject, key)
    _refused(_connector(sim, http, SIGN_CSR, late_token, {"csr": late_csr}))


def test_directors_token_signs_directly(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient, key: rsa.RSAPrivateKey
) -> None:
    """Either token of a SystemAuth serves either operation, as in Compass: a CSR for the
    SystemAuth's subject is signed with Director's token alone, which is then spent."""
    runtime_id = _new_runtime(director)
    token = _one_time_token(director, runtime_id)
    csr, _ = build_csr(parse_subject(SUBJECT.render(_auth_id(sim, runtime_id))), key)
    signed = _connector(sim, http, SIGN_CSR, token, {"csr": csr})
    assert signed.json().get("errors") is None, signed.text
    _refused(_connector(sim, http, CONNECTOR_CONFIGURATION, token))


def test_a_document_that_does_not_validate_spends_the_token(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient
) -> None:
    """The hydrator spends the token before Connector reads the request."""
    token = _one_time_token(director, _new_runtime(director))
    broken = _connector(sim, http, "query { result: configuration { nope } }", token)
    assert broken.status_code == 422
    assert broken.json()["data"] is None
    _refused(_connector(sim, http, CONNECTOR_CONFIGURATION, token))


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("CN", "CSR: Invalid common name provided."),
        ("C", "CSR: Invalid country provided."),
        ("O", "CSR: Invalid organization provided."),
        ("OU", "CSR: Invalid organizational unit provided."),
        ("L", "CSR: Invalid locality provided."),
        ("ST", "CSR: Invalid province provided."),
    ],
)
def test_csr_subject_is_checked_field_by_field(
    sim: CompassSimulator,
    http: httpx.Client,
    director: DirectorClient,
    key: rsa.RSAPrivateKey,
    field: str,
    message: str,
) -> None:
    csr_token, subject = _csr_token_and_subject(sim, http, director)
    wrong = {**subject, field: "XX" if field == "C" else "wrong"}
    csr, _ = build_csr(wrong, key)
    response = _connector(sim, http, SIGN_CSR, csr_token, {"csr": csr})
    # Connector's words, behind what its resolver adds, and no extensions.
    assert response.json()["errors"] == [
        {
            "message": f"Error while signing Certificate Signing Request: {message}",
            "path": ["result"],
        }
    ]
    assert response.json()["data"] is None


def test_csr_missing_a_subject_field_is_refused(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient, key: rsa.RSAPrivateKey
) -> None:
    csr_token, subject = _csr_token_and_subject(sim, http, director)
    del subject["OU"]
    csr, _ = build_csr(subject, key)
    [error] = _connector(sim, http, SIGN_CSR, csr_token, {"csr": csr}).json()["errors"]
    assert error["message"].endswith("CSR: No organizational unit provided.")


@pytest.mark.parametrize(
    ("csr", "message"),
    [
        ("%%% not base64 %%%", "Error while parsing base64 content"),
        (base64.b64encode(b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n").decode(), "CSR"),
    ],
)
def test_malformed_csr_is_a_bad_request(
    sim: CompassSimulator, http: httpx.Client, director: DirectorClient, csr: str, message: str
) -> None:
    csr_token, _ = _csr_token_and_subject(sim, http, director)
    [error] = _connector(sim, http, SIGN_CSR, csr_token, {"csr": csr}).json()["errors"]
    assert set(error) == {"message", "path"}
    assert message in error["message"]
