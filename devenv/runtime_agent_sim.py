"""A stand-in for Kyma's compass-runtime-agent, for the local demo.

It does the part of the real runtime agent that this project feeds: it reads the token secret
the agent wrote (`kyma-system/compass-agent-configuration`: CONNECTOR_URL, TOKEN, RUNTIME_ID,
TENANT), exchanges the one-time token at Compass Connector for a client certificate, stores the
certificate in the runtime, and reports in the cluster-scoped CompassConnection
`compass-connection`.

What always holds:
- the token is used only while the CompassConnection is missing or `ConnectionFailed`, as the
  real runtime agent does; after a failure the same token is never tried again: the state stays
  `ConnectionFailed` (with the error in `status.connectionStatus.error`) until a different token
  is in the secret;
- the exchange is Connector's: `configuration` with header `Connector-Token: <one-time token>`
  returns a CSR token and the subject; a fresh RSA 2048 key and a CSR for exactly that subject
  are made here with `cryptography`; `signCertificateSigningRequest` with the CSR token returns
  the certificate, which must carry that subject and this key;
- tokens, keys and certificates never reach a log line (a token is named by its sha256 prefix).

Run: `python -m devenv.runtime_agent_sim --kubeconfig FILE` (see `--help`); it stops on
SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import logging
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("runtime-agent-sim")

CC_GROUP, CC_VERSION, CC_PLURAL = "compass.kyma-project.io", "v1alpha1", "compassconnections"
CONNECTION_NAME = "compass-connection"
HEALTHY_STATES = frozenset({"Connected", "Synchronized"})

CONFIGURATION_QUERY = (
    "query { result: configuration { token { token } "
    "certificateSigningRequestInfo { subject keyAlgorithm } "
    "managementPlaneInfo { directorURL certificateSecuredConnectorURL } } }"
)
SIGN_CSR_MUTATION = (
    "mutation Sign($csr: String!) { result: signCertificateSigningRequest(csr: $csr) "
    "{ certificateChain caCertificate clientCertificate } }"
)

# Connector's subject string uses these short names ("O=...,OU=...,CN=<runtime ID>").
_SUBJECT_OIDS = {
    "CN": NameOID.COMMON_NAME,
    "C": NameOID.COUNTRY_NAME,
    "O": NameOID.ORGANIZATION_NAME,
    "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
    "L": NameOID.LOCALITY_NAME,
    "ST": NameOID.STATE_OR_PROVINCE_NAME,
}


class ExchangeError(Exception):
    """The exchange at Connector failed; the message is safe to show (no token in it)."""


@dataclass(frozen=True)
class TokenSecret:
    connector_url: str
    token: str
    runtime_id: str
    tenant: str

    @property
    def fingerprint(self) -> str:
        return token_fingerprint(self.token)

    @classmethod
    def from_data(cls, data: Mapping[str, Any] | None) -> TokenSecret | None:
        """The secret's decoded data, or None while a key is missing."""
        if not data:
            return None
        values = {k: base64.b64decode(v).decode() for k, v in data.items()}
        try:
            return cls(
                connector_url=values["CONNECTOR_URL"],
                token=values["TOKEN"],
                runtime_id=values["RUNTIME_ID"],
                tenant=values["TENANT"],
            )
        except KeyError:
            return None


@dataclass(frozen=True)
class IssuedCertificate:
    client_pem: bytes
    chain_pem: bytes
    ca_pem: bytes
    key_pem: bytes
    subject: str
    not_before: datetime
    not_after: datetime
    director_url: str
    secured_connector_url: str


def token_fingerprint(token: str) -> str:
    """How a token is named in logs and output: the first 12 hex digits of its sha256."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def parse_subject(subject: str) -> x509.Name:
    """Connector's "O=a,OU=b,...,CN=c" as an x509 name, in the order given."""
    attributes = []
    for part in subject.split(","):
        key, sep, value = part.partition("=")
        oid = _SUBJECT_OIDS.get(key.strip())
        if not sep or oid is None:
            raise ExchangeError(f"Connector returned an unexpected subject part {part!r}")
        attributes.append(x509.NameAttribute(oid, value))
    return x509.Name(attributes)


def build_csr(subject: x509.Name, key: rsa.RSAPrivateKey) -> str:
    """A CSR for `subject`, base64 of PEM, which is what signCertificateSigningRequest takes."""
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    return base64.b64encode(csr.public_bytes(serialization.Encoding.PEM)).decode()


def _spki(public_key: Any) -> bytes:
    return bytes(
        public_key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _graphql(http: httpx.Client, url: str, document: str, *, token: str, **variables: Any) -> Any:
    try:
        response = http.post(
            url,
            json={"query": document, "variables": variables},
            headers={"Connector-Token": token},
        )
    except httpx.TransportError as exc:
        raise ExchangeError(f"Connector unreachable: {type(exc).__name__}") from exc
    try:
        body = response.json()
    except ValueError as exc:
        raise ExchangeError(f"Connector answered HTTP {response.status_code}") from exc
    if response.status_code != 200 or body.get("errors") or not body.get("data"):
        messages = "; ".join(str(e.get("message", e)) for e in body.get("errors") or [])
        raise ExchangeError(
            f"Connector refused: HTTP {response.status_code} {messages or 'no data'}"
        )
    return body["data"]["result"]


def exchange_token(http: httpx.Client, connector_url: str, token: str) -> IssuedCertificate:
    """One-time token -> client certificate, in Connector's two calls."""
    configuration = _graphql(http, connector_url, CONFIGURATION_QUERY, token=token)
    subject_text = configuration["certificateSigningRequestInfo"]["subject"]
    subject = parse_subject(subject_text)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    signed = _graphql(
        http,
        connector_url,
        SIGN_CSR_MUTATION,
        token=configuration["token"]["token"],
        csr=build_csr(subject, key),
    )
    client_pem = base64.b64decode(signed["clientCertificate"])
    certificate = x509.load_pem_x509_certificate(client_pem)
    if certificate.subject != subject:
        raise ExchangeError("the certificate's subject is not the one asked for")
    if _spki(certificate.public_key()) != _spki(key.public_key()):
        raise ExchangeError("the certificate is not for our key")
    management = configuration.get("managementPlaneInfo") or {}
    return IssuedCertificate(
        client_pem=client_pem,
        chain_pem=base64.b64decode(signed["certificateChain"]),
        ca_pem=base64.b64decode(signed["caCertificate"]),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        subject=subject_text,
        not_before=certificate.not_valid_before_utc,
        not_after=certificate.not_valid_after_utc,
        director_url=management.get("directorURL") or "",
        secured_connector_url=management.get("certificateSecuredConnectorURL") or "",
    )


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


class RuntimeAgentSim:
    """One polling loop over the secret and the CompassConnection of one runtime."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        namespace: str,
        secret_name: str,
        certificate_secret: str,
        interval: float,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._namespace = namespace
        self._secret_name = secret_name
        self._certificate_secret = certificate_secret
        self._interval = interval
        self._failed_fingerprint: str | None = None
        self._http = httpx.Client(timeout=10.0)

    def close(self) -> None:
        self._http.close()

    def run(self, stop: threading.Event) -> None:
        log.info("watching secret %s/%s", self._namespace, self._secret_name)
        while not stop.is_set():
            try:
                self.step()
            except ApiException as exc:  # the API server restarting: try again next turn
                log.warning("API server error %s, retrying", exc.status)
            stop.wait(self._interval)

    def step(self) -> None:
        """One look at the world; connects when the connection is missing or failed."""
        connection = self._connection()
        state = ((connection or {}).get("status") or {}).get("connectionState")
        if state in HEALTHY_STATES:
            return
        secret = self._token_secret()
        if secret is None or secret.fingerprint == self._failed_fingerprint:
            return
        log.info("connecting with token sha256:%s", secret.fingerprint)
        try:
            issued = exchange_token(self._http, secret.connector_url, secret.token)
        except ExchangeError as exc:
            self._failed_fingerprint = secret.fingerprint
            log.warning("connection failed: %s", exc)
            self._report(connection, secret, state="ConnectionFailed", error=str(exc))
            return
        self._store_certificate(issued)
        self._report(connection, secret, state="Connected", issued=issued)
        log.info(
            "connected: certificate for %s valid until %s", issued.subject, _time(issued.not_after)
        )

    # -- the runtime's objects ---------------------------------------------------------

    def _token_secret(self) -> TokenSecret | None:
        try:
            found = self._core.read_namespaced_secret(self._secret_name, self._namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return TokenSecret.from_data(found.data)

    def _connection(self) -> dict[str, Any] | None:
        try:
            found = self._custom.get_cluster_custom_object(
                CC_GROUP, CC_VERSION, CC_PLURAL, CONNECTION_NAME
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], found)

    def _store_certificate(self, issued: IssuedCertificate) -> None:
        data = {
            "crt": issued.chain_pem,
            "key": issued.key_pem,
            "ca.crt": issued.ca_pem,
        }
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(name=self._certificate_secret),
            type="Opaque",
            data={k: base64.b64encode(v).decode() for k, v in data.items()},
        )
        try:
            self._core.create_namespaced_secret(self._namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self._core.replace_namespaced_secret(self._certificate_secret, self._namespace, body)

    def _report(
        self,
        connection: dict[str, Any] | None,
        secret: TokenSecret,
        *,
        state: str,
        error: str | None = None,
        issued: IssuedCertificate | None = None,
    ) -> None:
        if connection is None:
            # compass-runtime-agent writes both fields always (Go strings without omitempty;
            # the published CRD requires them): empty until a connection told it Director's.
            management = {
                "connectorUrl": secret.connector_url,
                "directorUrl": issued.director_url if issued is not None else "",
            }
            self._custom.create_cluster_custom_object(
                CC_GROUP,
                CC_VERSION,
                CC_PLURAL,
                {
                    "apiVersion": f"{CC_GROUP}/{CC_VERSION}",
                    "kind": "CompassConnection",
                    "metadata": {"name": CONNECTION_NAME},
                    "spec": {"managementInfo": management},
                },
            )
        now = _now()
        status: dict[str, Any] = {"connectionState": state}
        if issued is not None:
            status["connectionStatus"] = {
                "established": now,
                "lastSuccess": now,
                "lastSync": now,
                "error": None,  # merge patch: clears an earlier failure's message
                "certificateStatus": {
                    "acquired": now,
                    "notBefore": _time(issued.not_before),
                    "notAfter": _time(issued.not_after),
                },
            }
        else:
            status["connectionStatus"] = {
                "lastSync": now,
                "error": error or "",
                "certificateStatus": {},
            }
        self._custom.patch_cluster_custom_object(  # the CRD has no status subresource
            CC_GROUP, CC_VERSION, CC_PLURAL, CONNECTION_NAME, {"status": status}
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devenv.runtime_agent_sim",
        description="Simulated compass-runtime-agent: exchanges the one-time token in the "
        "agent's secret at Compass Connector for a client certificate and marks the "
        "CompassConnection Connected (or ConnectionFailed with the error).",
    )
    parser.add_argument("--kubeconfig", type=Path, required=True, help="the runtime's kubeconfig")
    parser.add_argument("--namespace", default="kyma-system", help="namespace of the secrets")
    parser.add_argument(
        "--secret", default="compass-agent-configuration", help="the token secret to read"
    )
    parser.add_argument(
        "--certificate-secret",
        default="cluster-client-certificates",
        help="where the client certificate and key are stored",
    )
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between looks")
    parser.add_argument("--log-level", default="INFO")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    api = config.new_client_from_config(config_file=str(args.kubeconfig))
    sim = RuntimeAgentSim(
        api,
        namespace=args.namespace,
        secret_name=args.secret,
        certificate_secret=args.certificate_secret,
        interval=args.interval,
    )
    try:
        sim.run(stop)
    finally:
        sim.close()
        with contextlib.suppress(Exception):
            api.close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
