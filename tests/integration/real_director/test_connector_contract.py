"""The simulator's Connector answers as the real Connector does: the real one the oracle.

The real side is Compass's own chain at the pinned commit (`real_connector`): Oathkeeper with
Compass's rules, the hydrator (which spends a token at the real Director) and the Connector, and
for the certificate-secured side our front in Istio's place. The simulated side is
`devenv/compass_sim`'s Connector and its certificate-secured side (`CertificateSecuredCompass`).

Every case is a short scenario: one-time tokens from Director for a fresh runtime, Connector
calls with them, and what each call answered. Both sides run it, and the answers must be equal
after normalising: HTTP status and media type, the body (tokens, runtime ID, the SystemAuth IDs
in certificate names, URLs by role), and a summary of every certificate issued (subject,
validity in days, chain, issuer, key usages, whether it is for the CSR's key). Where
`../shared/real-connector-notes.md` states the real answer, `check` pins it on both sides too.

What the cases hold the simulator to, among others: a spent, garbage or missing token is HTTP
400 with an empty body (the token is spent before the document is even read: a document that
does not validate spends it too); either token of a SystemAuth (Director's, or the one
`configuration` returned) serves `configuration` and `signCertificateSigningRequest`; the
certificate's CN is the SystemAuth's ID (a new one per Director token, never the runtime's
ID); the CSR's mistakes are HTTP 200 errors without extensions.
"""

from __future__ import annotations

import base64
import re
import ssl
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtensionOID

from devenv.compass_sim import CompassSimulator, SimConfig
from devenv.compass_sim.config import CsrSubject
from devenv.compass_sim.mtls import CertificateSecuredCompass
from devenv.compass_sim.testing import REGISTER_RUNTIME, REQUEST_ONE_TIME_TOKEN, DirectorClient
from devenv.compass_sim.testing import UNREGISTER_RUNTIME as UNREGISTER
from devenv.real_director import RealCompass
from devenv.real_director.connector import RealConnector
from devenv.runtime_agent_sim import (
    CONFIGURATION_QUERY,
    SIGN_CSR_MUTATION,
    build_csr,
    parse_subject,
)

pytestmark = pytest.mark.timeout(300)

GLOBAL_ACCOUNT = "connector-contract-ga"
# The fixed part of the subject: configuration on both sides (Compass's defaults here).
SUBJECT = "O=Org,OU=OrgUnit,L=Locality,ST=State,C=PL"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
CSR_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass
class Answer:
    status: int
    media_type: str
    body: Any  # parsed JSON, or the text

    @property
    def result(self) -> Any:
        return self.body["data"]["result"]


@dataclass
class Side:
    name: str
    connector_url: str
    secured_url: str
    director: DirectorClient
    http: httpx.Client
    workdir: Path

    def fresh(self) -> tuple[str, str]:
        """(runtime ID, a one-time token from Director) for a new runtime."""
        runtime = self.director.result(
            REGISTER_RUNTIME, {"in": {"name": f"contract-{uuid.uuid4().hex[:8]}", "labels": {}}}
        )
        return runtime["id"], self.token(runtime["id"])

    def token(self, runtime_id: str) -> str:
        return str(self.director.result(REQUEST_ONE_TIME_TOKEN, {"id": runtime_id})["token"])

    def unregister(self, runtime_id: str) -> None:
        self.director.result(UNREGISTER, {"id": runtime_id})

    def post(
        self,
        document: str | None,
        *,
        token: str | None = None,
        variables: dict[str, Any] | None = None,
        raw: bytes | None = None,
        query_token: str | None = None,
    ) -> Answer:
        headers = {} if token is None else {"Connector-Token": token}
        url = (
            self.connector_url
            if query_token is None
            else f"{self.connector_url}?token={query_token}"
        )
        if raw is not None:
            response = self.http.post(
                url, content=raw, headers={**headers, "Content-Type": "application/json"}
            )
        else:
            body = {"query": document, "variables": variables or {}}
            response = self.http.post(url, json=body, headers=headers)
        return _answer(response)

    def get(self) -> Answer:
        return _answer(self.http.get(self.connector_url))

    def configuration(self, token: str | None) -> Answer:
        return self.post(CONFIGURATION_QUERY, token=token)

    def sign(self, token: str | None, subject: str, key: Any = CSR_KEY) -> Answer:
        return self.post(SIGN_CSR_MUTATION, token=token, variables={"csr": _csr(subject, key)})

    def secured(self, certificate: dict[str, str], key: Any = CSR_KEY) -> httpx.Client:
        """A client with the certificate `signCertificateSigningRequest` returned."""
        name = uuid.uuid4().hex
        cert_path, key_path = self.workdir / f"{name}.crt", self.workdir / f"{name}.key"
        cert_path.write_bytes(base64.b64decode(certificate["clientCertificate"]))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.load_cert_chain(cert_path, key_path)
        return httpx.Client(verify=context, timeout=30)


def _answer(response: httpx.Response) -> Answer:
    media_type = response.headers.get("content-type", "").split(";", 1)[0].strip()
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    return Answer(response.status_code, media_type, body)


def _csr(subject: str, key: Any) -> str:
    return build_csr(parse_subject(subject), key)


def _subject(answer: Answer) -> str:
    return str(answer.result["certificateSigningRequestInfo"]["subject"])


def _csr_token(answer: Answer) -> str:
    return str(answer.result["token"]["token"])


# -- what is compared -------------------------------------------------------------------------


@dataclass
class Roles:
    """Names values by the role they play in one run, so two sides compare."""

    side: Side
    runtimes: list[str] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    auths: dict[str, str] = field(default_factory=dict)

    def text(self, value: str) -> str:
        value = value.replace(self.side.secured_url, "<secured>")
        value = value.replace(self.side.connector_url, "<connector>")
        for index, runtime in enumerate(self.runtimes):
            value = value.replace(runtime, f"<runtime-{index + 1}>")

        def auth(match: re.Match[str]) -> str:
            return self.auths.setdefault(match.group(0), f"<auth-{len(self.auths) + 1}>")

        return UUID.sub(auth, value)

    def token(self, value: str) -> str:
        """Tokens by order of appearance, with their length (Director's are 88 characters)."""
        if value not in self.tokens:
            self.tokens[value] = f"<token-{len(self.tokens) + 1}:{len(value)}>"
        return self.tokens[value]

    def body(self, value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: self.body(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self.body(v) for v in value]
        if isinstance(value, str):
            if key == "token":
                return self.token(value)
            if key in ("certificateChain", "caCertificate", "clientCertificate"):
                return "<base64 PEM>"
            return self.text(value)
        return value

    def answer(self, answer: Answer) -> dict[str, Any]:
        return {"status": answer.status, "type": answer.media_type, "body": self.body(answer.body)}

    def certificate(self, answer: Answer, key: Any = CSR_KEY) -> dict[str, Any]:
        """What a `signCertificateSigningRequest` result holds, by role."""
        result = answer.result
        client = x509.load_pem_x509_certificate(base64.b64decode(result["clientCertificate"]))
        chain = x509.load_pem_x509_certificates(base64.b64decode(result["certificateChain"]))
        cas = x509.load_pem_x509_certificates(base64.b64decode(result["caCertificate"]))
        usage = client.extensions.get_extension_for_oid(ExtensionOID.KEY_USAGE)
        extended = client.extensions.get_extension_for_oid(ExtensionOID.EXTENDED_KEY_USAGE)
        spki = serialization.PublicFormat.SubjectPublicKeyInfo
        der = serialization.Encoding.DER
        return {
            "subject": self.text(client.subject.rfc4514_string()),
            "days": round((client.not_valid_after_utc - client.not_valid_before_utc).days),
            "chain": [c == client for c in chain] + [c in cas for c in chain],
            "cas": len(cas),
            "issued_by_ca": client.issuer == cas[0].subject,
            "for_the_csr_key": client.public_key().public_bytes(der, spki)
            == key.public_key().public_bytes(der, spki),
            "key_usage": {
                "critical": usage.critical,
                "digital_signature": usage.value.digital_signature,
                "key_cert_sign": usage.value.key_cert_sign,
            },
            "extended_key_usage": sorted(o.dotted_string for o in extended.value),
            "is_ca": _is_ca(client),
        }


def _is_ca(certificate: x509.Certificate) -> bool:
    try:
        return certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


Scenario = Callable[[Side, Roles], list[Any]]
Check = Callable[[list[Any]], None]


@dataclass(frozen=True)
class Case:
    id: str
    run: Scenario
    check: Check | None = None  # what the notes say the real answer is


REFUSED = {"status": 400, "type": "application/json", "body": ""}


def _refused_only(*indices: int) -> Check:
    def check(seen: list[Any]) -> None:
        for index in indices:
            assert seen[index] == REFUSED, seen[index]

    return check


def _fresh_configuration(side: Side, roles: Roles) -> list[Any]:
    runtime, token = side.fresh()
    roles.runtimes.append(runtime)
    return [roles.answer(side.configuration(token))]


def _check_fresh(seen: list[Any]) -> None:
    assert seen[0]["status"] == 200
    result = seen[0]["body"]["data"]["result"]
    assert result["certificateSigningRequestInfo"] == {
        "subject": f"{SUBJECT},CN=<auth-1>",
        "keyAlgorithm": "rsa2048",
    }
    assert result["token"]["token"] == "<token-1:88>"
    assert result["managementPlaneInfo"] == {
        "directorURL": "<secured>/director/graphql",
        "certificateSecuredConnectorURL": "<secured>/connector/graphql",
    }


def _spent_twice(side: Side, roles: Roles) -> list[Any]:
    runtime, token = side.fresh()
    roles.runtimes.append(runtime)
    first = side.configuration(token)
    return [first.status, roles.answer(side.configuration(token))]


def _garbage_missing_empty(side: Side, roles: Roles) -> list[Any]:
    return [
        roles.answer(side.configuration("not-a-token")),
        roles.answer(side.configuration(None)),
        roles.answer(side.configuration("")),
        roles.answer(side.sign("not-a-token", "O=Org,CN=x")),
        roles.answer(side.get()),
    ]


def _exchange(side: Side, roles: Roles) -> list[Any]:
    """Director's token -> configuration -> the CSR token -> a certificate; both tokens spent."""
    runtime, token = side.fresh()
    roles.runtimes.append(runtime)
    roles.token(token)
    configuration = side.configuration(token)
    csr_token = _csr_token(configuration)
    signed = side.sign(csr_token, _subject(configuration))
    return [
        roles.answer(configuration),
        roles.answer(signed),
        roles.certificate(signed),
        roles.answer(side.sign(csr_token, _subject(configuration))),
        roles.answer(side.configuration(token)),
    ]


def _check_exchange(seen: list[Any]) -> None:
    certificate = seen[2]
    assert certificate["subject"].startswith("CN=<auth-1>,"), certificate
    assert certificate["days"] == 90
    assert certificate["issued_by_ca"]
    assert certificate["for_the_csr_key"]
    assert seen[3] == REFUSED
    assert seen[4] == REFUSED


def _csr_token_for_configuration(side: Side, roles: Roles) -> list[Any]:
    """The token `configuration` returns serves `configuration` again (same SystemAuth), and
    replaces the one before it."""
    runtime, token = side.fresh()
    roles.runtimes.append(runtime)
    roles.token(token)
    first = side.configuration(token)
    second = side.configuration(_csr_token(first))
    return [
        roles.answer(second),
        roles.answer(side.sign(_csr_token(first), _subject(first))),
        roles.answer(side.sign(_csr_token(second), _subject(second))).get("status"),
    ]


def _directors_token_signs(side: Side, roles: Roles) -> list[Any]:
    """Director's token serves `signCertificateSigningRequest` directly: the CSR's subject is
    checked against the SystemAuth's (here a wrong CN), not refused for the token."""
    runtime, token = side.fresh()
    roles.runtimes.append(runtime)
    return [roles.answer(side.sign(token, "O=Org,OU=OrgUnit,L=Locality,ST=State,C=PL,CN=x"))]


def _a_new_auth_per_token(side: Side, roles: Roles) -> list[Any]:
    """Each Director token of one runtime is a SystemAuth of its own: another CN."""
    runtime, token = side.fresh()
    roles.runtimes.append(runtime)
    first = side.configuration(token)
    second = side.configuration(side.token(runtime))
    return [roles.text(_subject(first)), roles.text(_subject(second))]


def _bad_csrs(side: Side, roles: Roles) -> list[Any]:
    runtime, _ = side.fresh()
    roles.runtimes.append(runtime)
    seen = []
    for make in (
        lambda subject: _csr(subject.rsplit("CN=", 1)[0] + "CN=someone-else", CSR_KEY),
        lambda subject: _csr(
            subject.replace("O=Org,", "O=Other,").replace("O=", "O=X", 1), CSR_KEY
        ),
        lambda subject: "not base64!",
        lambda subject: base64.b64encode(b"no PEM here").decode(),
    ):
        configuration = side.configuration(side.token(runtime))
        answer = side.post(
            SIGN_CSR_MUTATION,
            token=_csr_token(configuration),
            variables={"csr": make(_subject(configuration))},
        )
        seen.append(roles.answer(answer))
    return seen


def _ec_key(side: Side, roles: Roles) -> list[Any]:
    runtime, token = side.fresh()
    roles.runtimes.append(runtime)
    configuration = side.configuration(token)
    key: CertificateIssuerPrivateKeyTypes = ec.generate_private_key(ec.SECP256R1())
    return [roles.answer(side.sign(_csr_token(configuration), _subject(configuration), key))]


def _document_errors_spend_the_token(side: Side, roles: Roles) -> list[Any]:
    runtime, _ = side.fresh()
    roles.runtimes.append(runtime)
    seen = []
    for send in (
        lambda token: side.post("query { result: configuration { nope } }", token=token),
        lambda token: side.post(None, token=token, raw=b"{not json"),
        lambda token: side.post(SIGN_CSR_MUTATION, token=token),  # $csr missing
    ):
        token = side.token(runtime)
        answer = send(token)
        errors = answer.body.get("errors", []) if isinstance(answer.body, dict) else answer.body
        seen.append(
            {
                "status": answer.status,
                "codes": [e.get("extensions", {}).get("code") for e in errors],
                "data": answer.body.get("data", "absent"),
                "then": roles.answer(side.configuration(token)),
            }
        )
    return seen


def _token_in_the_query(side: Side, roles: Roles) -> list[Any]:
    runtime, token = side.fresh()
    roles.runtimes.append(runtime)
    return [roles.answer(side.post(CONFIGURATION_QUERY, query_token=token))["status"]]


def _unregistered(side: Side, roles: Roles) -> list[Any]:
    runtime, token = side.fresh()
    roles.runtimes.append(runtime)
    side.unregister(runtime)
    return [roles.answer(side.configuration(token))]


def _certificate_secured(side: Side, roles: Roles) -> list[Any]:
    """With the certificate: `configuration` (a new token, the same CN) and a renewal, with or
    without a token next to it; without a certificate no handshake."""
    runtime, token = side.fresh()
    roles.runtimes.append(runtime)
    configuration = side.configuration(token)
    signed = side.sign(_csr_token(configuration), _subject(configuration))
    seen: list[Any] = [roles.text(_subject(configuration))]
    url = f"{side.secured_url}/connector/graphql"
    with side.secured(signed.result) as secured:
        for headers in ({}, {"Connector-Token": "not-a-token"}):
            answer = _answer(
                secured.post(url, json={"query": CONFIGURATION_QUERY}, headers=headers)
            )
            seen.append(roles.answer(answer))
        renewal = _answer(
            secured.post(
                url,
                json={
                    "query": SIGN_CSR_MUTATION,
                    "variables": {"csr": _csr(_subject(configuration), CSR_KEY)},
                },
            )
        )
        seen += [roles.answer(renewal)["status"], roles.certificate(renewal)]
    with httpx.Client(verify=False, timeout=10) as anonymous:
        try:
            anonymous.post(url, json={"query": CONFIGURATION_QUERY})
            seen.append("answered without a certificate")
        except httpx.TransportError:
            seen.append("no handshake without a certificate")
    return seen


CASES = [
    Case("fresh-configuration", _fresh_configuration, _check_fresh),
    Case("spent-token", _spent_twice, _refused_only(1)),
    Case("garbage-missing-empty-get", _garbage_missing_empty, _refused_only(0, 1, 2, 3, 4)),
    Case("exchange", _exchange, _check_exchange),
    Case("csr-token-serves-configuration", _csr_token_for_configuration),
    Case("directors-token-signs", _directors_token_signs),
    Case("a-new-auth-per-token", _a_new_auth_per_token),
    Case("bad-csrs", _bad_csrs),
    Case("ec-key", _ec_key),
    Case("document-errors-spend-the-token", _document_errors_spend_the_token),
    Case("token-in-the-query", _token_in_the_query),
    Case("unregistered-runtime", _unregistered, _refused_only(0)),
    Case("certificate-secured", _certificate_secured),
]


# -- the two sides -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def sim_side(http: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Side]:
    config = SimConfig(
        client_id="contract",
        client_secret="contract-secret",
        csr_subject=CsrSubject(
            organization="Org",
            organizational_unit="OrgUnit",
            locality="Locality",
            province="State",
            country="PL",
        ),
    )
    with CompassSimulator(config).running() as sim:
        secured = CertificateSecuredCompass(sim).start()
        director = DirectorClient(
            http, sim.director_url, token=sim.issue_access_token(), tenant=GLOBAL_ACCOUNT
        )
        try:
            yield Side(
                name="simulator",
                connector_url=sim.connector_url,
                secured_url=secured.url,
                director=director,
                http=http,
                workdir=tmp_path_factory.mktemp("sim-connector"),
            )
        finally:
            secured.stop()


@pytest.fixture(scope="module")
def real_side(
    real_compass: RealCompass,
    real_connector: RealConnector,
    http: httpx.Client,
    tmp_path_factory: pytest.TempPathFactory,
) -> Side:
    real_compass.add_global_account(GLOBAL_ACCOUNT)
    director = DirectorClient(
        http, real_compass.director_url, token=real_compass.access_token(), tenant=GLOBAL_ACCOUNT
    )
    return Side(
        name="real Connector",
        connector_url=real_connector.url,
        secured_url=real_connector.certificate_secured_url,
        director=director,
        http=http,
        workdir=tmp_path_factory.mktemp("real-connector"),
    )


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_simulators_connector_answers_as_the_real_one(
    case: Case, real_side: Side, sim_side: Side
) -> None:
    real = case.run(real_side, Roles(real_side))
    if case.check is not None:
        case.check(real)  # the notes still describe the real Connector
    sim = case.run(sim_side, Roles(sim_side))
    assert sim == real, f"{case.id}:\nthe simulator: {sim!r}\nthe real Connector: {real!r}"
    if case.check is not None:
        case.check(sim)
