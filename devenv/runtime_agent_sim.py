"""A stand-in for Kyma's compass-runtime-agent (application-connector-manager 859cac3), for the
local demo and the tests: the part of the real agent this project feeds, with the real one's
timing, certificate layout and states (`tests/integration/real_runtime_agent/test_contract.py`
runs one scenario against both and compares them).

Like the real agent it is a controller of one object, the cluster-scoped CompassConnection
`compass-connection`:

- **When it acts.** At start (the real `main` initialises the connection once), on every change
  of the CompassConnection (looked at every `--event-poll` seconds: a new resourceVersion or its
  disappearance is a watch event, its own updates included) and at the controller's resync:
  every `--sync-period` seconds jittered once at start by 0.9-1.1x as controller-runtime does,
  the first about two periods after start (client-go's resync timing). Never on a change of the
  Secret. A reconcile does nothing while `status.connectionStatus.lastSync` is less than
  `--minimal-sync` whole seconds old (unless `spec.resyncNow`); a failed reconcile is requeued
  with controller-runtime's backoff (5 ms doubling).
- **What it does.** Missing CompassConnection: creates it after a connection attempt. In
  `ConnectionFailed`: reads the Secret again (`CONNECTOR_URL`, `TOKEN`, `RUNTIME_ID`, `TENANT`)
  and tries whatever `TOKEN` holds; no memory of a spent token. The exchange is Connector's:
  `configuration` with `Connector-Token`, an RSA 4096 key and a CSR for the subject it returned,
  `signCertificateSigningRequest` with the CSR token. Success stores `crt` (the client
  certificate), `crtChain` and `key` (PKCS#1) in `--certificate-secret` and the CA as `cacert` in
  `--ca-secret` (merged into what is there, as the real one does; a missing namespace loses the
  spent token), sets `Connected` and `spec.managementInfo` to the `managementPlaneInfo` Connector
  returned (`connectorUrl`: the certificate-secured Connector, `directorUrl`). Otherwise: checks
  the connection on the certificate-secured Connector over mutual TLS (renewing the certificate
  when less than 30 % of its validity or two minimal sync times remain), then, when the minimal
  sync time passed since the last synchronisation, syncs with Director over mutual TLS
  (`runtime(id){labels}`, `applicationsForRuntime`, `setRuntimeLabel` for its two URL labels
  when they differ) with `RUNTIME_ID`/`TENANT` read from the Secret, and sets `Synchronized`;
  failures set `ConnectionMaintenanceFailed`, `SynchronizationFailed` or `MetadataUpdateFailed`
  with the error, as the real one does. It writes the whole object (an update, not a patch),
  with nulls where Go writes zero times.
- Tokens, keys and certificates never reach a log line (a token is named by its sha256 prefix).

Not imitated: Applications (Director's list is applied by the real agent; the simulator's is
always empty, and the stand-in touches no Application), metrics and health endpoints.

`--interval S` is the option of the stand-in before issue 27, kept for callers that still pass
it: sync period S, minimal sync time S (at least 1 s), the CA Secret in `--namespace`, and it
stops at `Connected` (no certificate-secured check, no Director sync), for a Compass without
its certificate-secured side.

Run: `python -m devenv.runtime_agent_sim --kubeconfig FILE` (see `--help`); it stops on
SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import logging
import random
import signal
import ssl
import sys
import tempfile
import threading
import time
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
KEY_SIZE = 4096  # the real agent's rsaKeySize (internal/certificates/csrprovider.go)

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


def _attributes(name: x509.Name) -> list[tuple[str, str]]:
    """A name's attributes, whatever their order."""
    return sorted((a.oid.dotted_string, str(a.value)) for a in name)


def _spki(public_key: Any) -> bytes:
    return bytes(
        public_key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _graphql(
    http: httpx.Client,
    url: str,
    document: str,
    *,
    token: str | None = None,
    headers: Mapping[str, str] | None = None,
    **variables: Any,
) -> Any:
    """`data.result` of one GraphQL call; `token` goes into `Connector-Token`."""
    sent = dict(headers or {})
    if token is not None:
        sent["Connector-Token"] = token
    try:
        response = http.post(url, json={"query": document, "variables": variables}, headers=sent)
    except httpx.HTTPError as exc:
        raise ExchangeError(f"Connector unreachable: {type(exc).__name__}") from exc
    try:
        body = response.json()
    except ValueError as exc:
        # The real agent's GraphQL client (machinebox/graphql) on a body that is no JSON, such
        # as Connector's empty HTTP 400 for a token that names no one.
        if response.status_code != 200:
            raise ExchangeError(
                f"graphql: server returned a non-200 status code: {response.status_code}"
            ) from exc
        raise ExchangeError(f"Connector answered HTTP {response.status_code}") from exc
    if response.status_code != 200 or body.get("errors") or not body.get("data"):
        messages = "; ".join(str(e.get("message", e)) for e in body.get("errors") or [])
        raise ExchangeError(
            f"Connector refused: HTTP {response.status_code} {messages or 'no data'}"
        )
    return body["data"]["result"]


def exchange_token(
    http: httpx.Client, connector_url: str, token: str | None, *, key_size: int = KEY_SIZE
) -> IssuedCertificate:
    """One-time token -> client certificate, in Connector's two calls (`token` None: over the
    certificate-secured Connector, where the client certificate speaks for the runtime)."""
    if not connector_url:
        raise ExchangeError("Failed to establish connection. Connector URL is empty")
    configuration = _graphql(http, connector_url, CONFIGURATION_QUERY, token=token)
    subject_text = configuration["certificateSigningRequestInfo"]["subject"]
    subject = parse_subject(subject_text)
    key = rsa.generate_private_key(public_exponent=65537, key_size=key_size)
    signed = _graphql(
        http,
        connector_url,
        SIGN_CSR_MUTATION,
        token=configuration["token"]["token"] if token is not None else None,
        csr=build_csr(subject, key),
    )
    client_pem = base64.b64decode(signed["clientCertificate"])
    certificate = x509.load_pem_x509_certificate(client_pem)
    # The same attributes; Connector writes them in Go's order (C, ST, L, O, OU, CN).
    if _attributes(certificate.subject) != _attributes(subject):
        raise ExchangeError("the certificate's subject is not the one asked for")
    if _spki(certificate.public_key()) != _spki(key.public_key()):
        raise ExchangeError("the certificate is not for our key")
    management = configuration.get("managementPlaneInfo") or {}
    return IssuedCertificate(
        client_pem=client_pem,
        chain_pem=base64.b64decode(signed["certificateChain"]),
        ca_pem=base64.b64decode(signed["caCertificate"]),
        key_pem=key.private_bytes(  # "RSA PRIVATE KEY", as Go's MarshalPKCS1PrivateKey
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        ),
        subject=subject_text,
        not_before=certificate.not_valid_before_utc,
        not_after=certificate.not_valid_after_utc,
        director_url=management.get("directorURL") or "",
        secured_connector_url=management.get("certificateSecuredConnectorURL") or "",
    )


# -- time, as the real agent writes and compares it -------------------------------------------


def format_time(value: datetime) -> str:
    """metav1.Time as JSON: RFC 3339 in whole seconds, UTC."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object) -> datetime | None:
    """A metav1.Time from JSON; None for null, absent or unreadable (Go's zero time)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _unix(value: datetime | None) -> int:
    # Go's zero time (year 1) as a Unix second: far in the past, so never "recent".
    return -62135596800 if value is None else int(value.timestamp())


def _seconds_since(now: datetime, then: object) -> int:
    return int(now.timestamp()) - _unix(parse_time(then))


def skip_connection_sync(connection: Mapping[str, Any], now: datetime, minimal: float) -> bool:
    """The real reconciler's rate limit: nothing happens while `connectionStatus.lastSync` is
    less than `minimal` whole seconds old, unless `spec.resyncNow` (controller.go)."""
    spec = connection.get("spec") or {}
    status = (connection.get("status") or {}).get("connectionStatus")
    if spec.get("resyncNow") or status is None:
        return False
    return _seconds_since(now, status.get("lastSync")) < int(minimal)


def skip_application_sync(connection: Mapping[str, Any], now: datetime, minimal: float) -> bool:
    """The same for the Director sync, on `synchronizationStatus.lastAttempt`."""
    spec = connection.get("spec") or {}
    status = (connection.get("status") or {}).get("synchronizationStatus")
    if spec.get("resyncNow") or status is None:
        return False
    return _seconds_since(now, status.get("lastAttempt")) < int(minimal)


def should_renew(
    connection: Mapping[str, Any], now: datetime, *, threshold: float, minimal: float
) -> bool:
    """CompassConnection.ShouldRenewCertificate: asked for, or less than `threshold` of the
    validity or two minimal sync times left."""
    if (connection.get("spec") or {}).get("refreshCredentialsNow"):
        return True
    status = ((connection.get("status") or {}).get("connectionStatus")) or {}
    certificate = status.get("certificateStatus") or {}
    not_before = _unix(parse_time(certificate.get("notBefore")))
    not_after = _unix(parse_time(certificate.get("notAfter")))
    left = not_after - now.timestamp()
    return left < (not_after - not_before) * threshold or left < 2 * minimal


def jittered(period: float, fraction: float) -> float:
    """controller-runtime's calculateResyncPeriod: `period` times a factor in [0.9, 1.1);
    `fraction` in [0, 1) picks it."""
    return period * (0.9 + fraction / 5.0)


class ResyncClock:
    """When the informer resyncs, as client-go does it: the reflector's timer ticks every
    `period` from its start; the controller's listener, added just after, resyncs on a tick at
    or after its own `next` (then `next` = tick + period). The first resync therefore comes
    about two periods after start, later ones every period."""

    def __init__(self, period: float, start: float) -> None:
        self.period = period
        self.next_tick = start + period
        self._next_resync = start + period + min(0.05, period / 100)

    def tick(self, now: float) -> bool:
        """Call once `now >= next_tick`: whether this tick resyncs."""
        resync = now >= self._next_resync
        if resync:
            self._next_resync = now + self.period
        self.next_tick = now + self.period
        return resync


def requeue_delay(failures: int) -> float:
    """controller-runtime's per-item backoff after a failed reconcile: 5 ms doubling, 1000 s cap."""
    return float(min(0.005 * 2 ** max(failures - 1, 0), 1000.0))


def new_connection() -> dict[str, Any]:
    """An empty CompassConnection as the real agent builds it before its first attempt."""
    return {
        "apiVersion": f"{CC_GROUP}/{CC_VERSION}",
        "kind": "CompassConnection",
        "metadata": {"name": CONNECTION_NAME},
        "spec": {"managementInfo": {"directorUrl": "", "connectorUrl": ""}},
        "status": {"connectionState": "", "connectionStatus": None, "synchronizationStatus": None},
    }


def _connection_status(status: dict[str, Any]) -> dict[str, Any]:
    """`status.connectionStatus`, made as Go marshals a fresh ConnectionStatus when absent."""
    current = status.get("connectionStatus")
    if not isinstance(current, dict):
        current = {
            "established": None,
            "renewed": None,
            "lastSync": None,
            "lastSuccess": None,
            "certificateStatus": {"acquired": None, "notBefore": None, "notAfter": None},
        }
        status["connectionStatus"] = current
    return current


def set_connection_failed(connection: dict[str, Any], now: datetime, error: str) -> None:
    status = connection.setdefault("status", {})
    status["connectionState"] = "ConnectionFailed"
    current = _connection_status(status)
    current["lastSync"] = format_time(now)
    current["error"] = error


def set_connected(connection: dict[str, Any], now: datetime, issued: IssuedCertificate) -> None:
    status = connection.setdefault("status", {})
    at = format_time(now)
    status["connectionState"] = "Connected"
    status["connectionStatus"] = {
        "established": at,
        "renewed": None,
        "lastSync": at,
        "lastSuccess": at,
        "certificateStatus": {
            "acquired": at,
            "notBefore": format_time(issued.not_before),
            "notAfter": format_time(issued.not_after),
        },
    }
    connection.setdefault("spec", {})["managementInfo"] = {
        "directorUrl": issued.director_url,
        "connectorUrl": issued.secured_connector_url,
    }


def set_maintenance_failed(connection: dict[str, Any], now: datetime, error: str) -> None:
    status = connection.setdefault("status", {})
    status["connectionState"] = "ConnectionMaintenanceFailed"
    current = _connection_status(status)
    current["lastSync"] = format_time(now)
    current["error"] = error


def set_sync_failed(
    connection: dict[str, Any], now: datetime, error: str, state: str = "SynchronizationFailed"
) -> None:
    status = connection.setdefault("status", {})
    status["connectionState"] = state
    sync = status.get("synchronizationStatus")
    at = format_time(now)
    if state == "SynchronizationFailed":
        if not isinstance(sync, dict):
            sync = {
                "lastAttempt": None,
                "lastSuccessfulFetch": None,
                "lastSuccessfulApplication": None,
            }
        sync["lastAttempt"] = at
        sync["error"] = error
    else:  # failed after the fetch: ResourceApplicationFailed, MetadataUpdateFailed
        sync = {
            "lastAttempt": at,
            "lastSuccessfulFetch": at,
            "lastSuccessfulApplication": None,
            "error": error,
        }
    status["synchronizationStatus"] = sync


def set_synchronized(connection: dict[str, Any], now: datetime) -> None:
    status = connection.setdefault("status", {})
    at = format_time(now)
    status["connectionState"] = "Synchronized"
    status["synchronizationStatus"] = {
        "lastAttempt": at,
        "lastSuccessfulFetch": at,
        "lastSuccessfulApplication": at,
    }
    connection.setdefault("spec", {}).pop("resyncNow", None)


# -- the controller ----------------------------------------------------------------------------

DIRECTOR_FETCH = (
    "query ($id: ID!) { runtime(id: $id) { labels } "
    "applicationsForRuntime(runtimeID: $id) { data { id name } "
    "pageInfo { startCursor endCursor hasNextPage } totalCount } }"
)
SET_LABEL = (
    "mutation ($id: ID!, $key: String!, $value: Any!) "
    "{ result: setRuntimeLabel(runtimeID: $id, key: $key, value: $value) { key value } }"
)


@dataclass(frozen=True)
class Timing:
    sync_period: float = 180.0  # the module's APP_CONTROLLER_SYNC_PERIOD
    minimal_sync: float = 15.0  # its APP_MINIMAL_COMPASS_SYNC_TIME
    event_poll: float = 0.2
    renewal_threshold: float = 0.3  # APP_CERT_VALIDITY_RENEWAL_THRESHOLD


@dataclass(frozen=True)
class Names:
    namespace: str = "kyma-system"
    config_secret: str = "compass-agent-configuration"  # noqa: S105 - a name
    certificate_secret: str = "cluster-client-certificates"  # noqa: S105 - in `namespace`
    ca_secret: str = "istio-system/kyma-gateway-certs-cacert"  # noqa: S105 - namespace/name
    events_url: str = "https://gateway.kyma.local"  # APP_RUNTIME_EVENTS_URL's default
    console_url: str = "https://console.kyma.local"  # APP_RUNTIME_CONSOLE_URL's default


class _Conflict(Exception):
    """An update lost against a newer version: requeued, as the real reconcile's error is."""


@dataclass
class _Credentials:
    chain_pem: bytes
    key_pem: bytes


class RuntimeAgentSim:
    """The CompassConnection controller of one runtime; `run(stop)` until `stop` is set."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        names: Names | None = None,
        timing: Timing | None = None,
        until_connected: bool = False,
        key_size: int = KEY_SIZE,
        fraction: float | None = None,
    ) -> None:
        names = names or Names()
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self.names = names
        self.timing = timing or Timing()
        self._until_connected = until_connected
        self._key_size = key_size
        self._fraction = random.random() if fraction is None else fraction
        self.period = jittered(self.timing.sync_period, self._fraction)
        self._http = httpx.Client(timeout=10.0)
        self._secured: httpx.Client | None = None
        self._credentials: _Credentials | None = None
        self._urls: tuple[str, str] = ("", "")  # (director, certificate-secured connector)

    def close(self) -> None:
        self._http.close()
        if self._secured is not None:
            self._secured.close()

    # -- the loop ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        log.info(
            "controller for %s: sync period %.1fs (jittered from %gs), minimal sync %gs",
            CONNECTION_NAME,
            self.period,
            self.timing.sync_period,
            self.timing.minimal_sync,
        )
        clock = ResyncClock(self.period, time.monotonic())
        self._guarded(self.initialize)  # cmd/main.go: once, before the controller starts
        seen = self._version()
        pending = True  # the informer's first list delivers the object
        failures = 0
        requeue_at: float | None = None
        while not stop.is_set():
            now = time.monotonic()
            # A resync delivers the objects in the informer's cache: none, none delivered.
            if now >= clock.next_tick and clock.tick(now) and seen is not None:
                log.debug("resync")
                pending = True
            if requeue_at is not None and now >= requeue_at:
                requeue_at, pending = None, True
            version = self._guarded(self._version, default=seen)
            if version != seen:
                seen, pending = version, True
            if pending:
                pending = False
                if self._guarded(self.reconcile, default=False) is False:
                    failures += 1
                    requeue_at = time.monotonic() + requeue_delay(failures)
                else:
                    failures = 0
            stop.wait(self.timing.event_poll)

    def _guarded(self, step: Any, default: Any = None) -> Any:
        try:
            return step()
        except (ApiException, _Conflict, ExchangeError, httpx.HTTPError, ValueError) as exc:
            log.warning("reconcile failed (requeued): %s", _describe(exc))
            return default

    def _version(self) -> str | None:
        found = self._connection()
        return None if found is None else str(found["metadata"].get("resourceVersion"))

    # -- Reconcile (controller.go) ---------------------------------------------------------

    def reconcile(self) -> bool:
        """One reconcile; False when it failed (requeued with backoff)."""
        connection = self._connection()
        if connection is None:
            log.info("no CompassConnection: initialising a new connection")
            self.initialize()
        elif skip_connection_sync(connection, datetime.now(UTC), self.timing.minimal_sync):
            pass
        elif (connection.get("status") or {}).get("connectionState") == "ConnectionFailed":
            self.initialize()
        elif not self._until_connected:
            if not self._maintain(connection):
                return False  # the real reconcile returns the maintenance error
            if not skip_application_sync(connection, datetime.now(UTC), self.timing.minimal_sync):
                self._synchronize(connection)
        return True

    # -- the supervisor (supervisor.go) ------------------------------------------------------

    def initialize(self) -> None:
        """InitializeCompassConnection: create or retry the connection; a healthy one only
        refreshes the cached credentials and URLs."""
        connection = self._connection()
        if connection is None:
            connection = new_connection()
            self._establish(connection)
            self._custom.create_cluster_custom_object(CC_GROUP, CC_VERSION, CC_PLURAL, connection)
            return
        if (connection.get("status") or {}).get("connectionState") != "ConnectionFailed":
            self._load_credentials()
            info = (connection.get("spec") or {}).get("managementInfo") or {}
            self._urls = (info.get("directorUrl", ""), info.get("connectorUrl", ""))
            return
        self._establish(connection)
        self._update(connection)

    def _establish(self, connection: dict[str, Any]) -> None:
        secret = self._config_secret()
        now = datetime.now(UTC)
        if isinstance(secret, str):
            set_connection_failed(connection, now, f"Failed to retrieve certificate: {secret}")
            return
        log.info("connecting with token sha256:%s", token_fingerprint(secret.get("TOKEN", "")))
        try:
            issued = exchange_token(
                self._http,
                secret.get("CONNECTOR_URL", ""),
                secret.get("TOKEN", ""),
                key_size=self._key_size,
            )
        except ExchangeError as exc:
            log.warning("connection failed: %s", exc)
            set_connection_failed(connection, now, f"Failed to retrieve certificate: {exc}")
            return
        try:
            self._preserve(issued)
        except ApiException as exc:
            error = f"Failed to preserve certificate: {_describe(exc)}"
            log.warning("connection failed: %s", error)
            set_connection_failed(connection, datetime.now(UTC), error)
            return
        set_connected(connection, datetime.now(UTC), issued)
        self._urls = (issued.director_url, issued.secured_connector_url)
        log.info(
            "connected: certificate for %s valid until %s",
            issued.subject,
            format_time(issued.not_after),
        )

    def _maintain(self, connection: dict[str, Any]) -> bool:
        now = datetime.now(UTC)
        try:
            renew = should_renew(
                connection,
                now,
                threshold=self.timing.renewal_threshold,
                minimal=self.timing.minimal_sync,
            )
            renew = renew or not self._exists(*self._split(self.names.ca_secret))
            http = self._secured_client()
            _, connector_url = self._urls
            if renew:
                issued = exchange_token(http, connector_url, None, key_size=self._key_size)
                self._preserve(issued)
                connection["status"]["connectionStatus"]["certificateStatus"] = {
                    "acquired": format_time(now),
                    "notBefore": format_time(issued.not_before),
                    "notAfter": format_time(issued.not_after),
                }
                connection["status"]["connectionStatus"]["renewed"] = format_time(now)
                connection.setdefault("spec", {}).pop("refreshCredentialsNow", None)
                info = {
                    "directorURL": issued.director_url,
                    "certificateSecuredConnectorURL": issued.secured_connector_url,
                }
            else:
                info = (
                    _graphql(http, connector_url, CONFIGURATION_QUERY).get("managementPlaneInfo")
                    or {}
                )
            if not info.get("certificateSecuredConnectorURL") or not info.get("directorURL"):
                raise ExchangeError("Connector URL or Director URL is empty")
            self._urls = (info["directorURL"], info["certificateSecuredConnectorURL"])
        except (ExchangeError, ApiException, httpx.HTTPError, OSError, ValueError) as exc:
            error = (
                "Error while trying to maintain connection: Failed to connect to Compass "
                f"Connector: {_describe(exc)}"
            )
            log.warning("%s", error)
            set_maintenance_failed(connection, datetime.now(UTC), error)
            self._update(connection)
            return False
        status = _connection_status(connection.setdefault("status", {}))
        status["lastSync"] = status["lastSuccess"] = format_time(datetime.now(UTC))
        return True

    def _synchronize(self, connection: dict[str, Any]) -> None:
        secret = self._config_secret()
        if isinstance(secret, str):
            set_sync_failed(
                connection, datetime.now(UTC), f"Failed to read Runtime config: {secret}"
            )
            self._update(connection)
            return
        runtime_id, tenant = secret.get("RUNTIME_ID", ""), secret.get("TENANT", "")
        director_url, _ = self._urls
        headers = {"Tenant": tenant}
        try:
            http = self._secured_client()
            fetched = _director(http, director_url, DIRECTOR_FETCH, headers, id=runtime_id)
            if fetched.get("runtime") is None or fetched.get("applicationsForRuntime") is None:
                raise ExchangeError("received nil response")
        except (ExchangeError, httpx.HTTPError, OSError) as exc:
            set_sync_failed(
                connection, datetime.now(UTC), f"Failed to fetch configuration: {_describe(exc)}"
            )
            self._update(connection)
            return
        labels = fetched["runtime"].get("labels") or {}
        targets = {
            "runtime_eventServiceUrl": self.names.events_url,
            "runtime_consoleUrl": self.names.console_url,
        }
        try:
            for key, value in targets.items():
                if labels.get(key) != value:
                    _graphql(
                        http,
                        director_url,
                        SET_LABEL,
                        headers=headers,
                        id=runtime_id,
                        key=key,
                        value=value,
                    )
        except (ExchangeError, httpx.HTTPError, OSError) as exc:
            set_sync_failed(
                connection,
                datetime.now(UTC),
                f"Failed to reconcile Runtime labels with proper URLs: {_describe(exc)}",
                state="MetadataUpdateFailed",
            )
            self._update(connection)
            return
        set_synchronized(connection, datetime.now(UTC))
        self._update(connection)
        log.info("synchronized with Director")

    # -- credentials ---------------------------------------------------------------------

    def _preserve(self, issued: IssuedCertificate) -> None:
        """PreserveCredentials: the client certificate, chain and key into one Secret, the CA
        into another, each merged into what is there (UpsertWithMerge)."""
        self._upsert_merge(
            self.names.namespace,
            self.names.certificate_secret,
            {"crt": issued.client_pem, "key": issued.key_pem, "crtChain": issued.chain_pem},
        )
        self._upsert_merge(*self._split(self.names.ca_secret), {"cacert": issued.ca_pem})
        self._credentials = _Credentials(chain_pem=issued.chain_pem, key_pem=issued.key_pem)
        if self._secured is not None:
            self._secured.close()
            self._secured = None

    def _load_credentials(self) -> None:
        data = self._secret_data(self.names.namespace, self.names.certificate_secret)
        if data is None or "crtChain" not in data or "key" not in data:
            raise ValueError(
                f"failed to read credentials while initializing Compass Connection CR: "
                f"{self.names.namespace}/{self.names.certificate_secret} is missing or incomplete"
            )
        self._credentials = _Credentials(chain_pem=data["crtChain"], key_pem=data["key"])

    def _secured_client(self) -> httpx.Client:
        if self._secured is None:
            if self._credentials is None:
                self._load_credentials()
            assert self._credentials is not None
            self._secured = httpx.Client(
                timeout=10.0,
                verify=_client_tls(self._credentials),  # APP_SKIP_COMPASS_TLS_VERIFY
            )
        return self._secured

    # -- the runtime's objects -------------------------------------------------------------

    @staticmethod
    def _split(namespaced: str) -> tuple[str, str]:
        namespace, _, name = namespaced.partition("/")
        return namespace, name

    def _secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        try:
            found = self._core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return {k: base64.b64decode(v) for k, v in (found.data or {}).items()}

    def _exists(self, namespace: str, name: str) -> bool:
        return self._secret_data(namespace, name) is not None

    def _config_secret(self) -> dict[str, str] | str:
        """The configuration Secret's values, or the real agent's error text."""
        try:
            data = self._secret_data(self.names.namespace, self.names.config_secret)
        except ApiException as exc:
            data, problem = None, _describe(exc)
        else:
            problem = f'secrets "{self.names.config_secret}" not found'
        where = f"{self.names.namespace}/{self.names.config_secret}"
        if data is None:
            return f"Failed to read Connection config from {where} Secret: {problem}"
        return {k: v.decode(errors="replace") for k, v in data.items()}

    def _upsert_merge(self, namespace: str, name: str, values: Mapping[str, bytes]) -> None:
        current = self._secret_data(namespace, name) or {}
        merged = {**current, **values}
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            data={k: base64.b64encode(v).decode() for k, v in merged.items()},
        )
        try:
            self._core.replace_namespaced_secret(name, namespace, body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._core.create_namespaced_secret(namespace, body)

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

    def _update(self, connection: dict[str, Any]) -> None:
        """An update of the whole object (the CRD has no status subresource), with the
        resourceVersion it was read at."""
        try:
            self._custom.replace_cluster_custom_object(
                CC_GROUP, CC_VERSION, CC_PLURAL, CONNECTION_NAME, connection
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                raise _Conflict(f"update of {CONNECTION_NAME}: HTTP {exc.status}") from exc
            raise


def _director(
    http: httpx.Client, url: str, document: str, headers: Mapping[str, str], **variables: Any
) -> dict[str, Any]:
    """`data` of a Director query with several root fields."""
    response = http.post(url, json={"query": document, "variables": variables}, headers=headers)
    try:
        body = response.json()
    except ValueError as exc:
        raise ExchangeError(f"Director answered HTTP {response.status_code}") from exc
    if response.status_code != 200 or body.get("errors") or not body.get("data"):
        messages = "; ".join(str(e.get("message", e)) for e in body.get("errors") or [])
        raise ExchangeError(f"Director refused: HTTP {response.status_code} {messages}")
    return cast(dict[str, Any], body["data"])


def _client_tls(credentials: _Credentials) -> ssl.SSLContext:
    """A TLS context presenting the client certificate chain; the server is not verified, as
    with the module's APP_SKIP_COMPASS_TLS_VERIFY=true. The key touches the disk only in a
    private temporary folder, for the moment `load_cert_chain` needs it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with tempfile.TemporaryDirectory(prefix="runtime-agent-sim-") as folder:
        cert, key = Path(folder, "tls.crt"), Path(folder, "tls.key")
        cert.write_bytes(credentials.chain_pem)
        key.touch(mode=0o600)
        key.write_bytes(credentials.key_pem)
        context.load_cert_chain(cert, key)
    return context


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return str(exc) or type(exc).__name__


def build_parser() -> argparse.ArgumentParser:
    defaults, names = Timing(), Names()
    parser = argparse.ArgumentParser(
        prog="python -m devenv.runtime_agent_sim",
        description="Simulated compass-runtime-agent: a CompassConnection controller that "
        "exchanges the one-time token in the agent's secret at Compass Connector for a client "
        "certificate (Connected), then checks the connection and syncs with Director over "
        "mutual TLS (Synchronized), with the real agent's timing.",
    )
    parser.add_argument("--kubeconfig", type=Path, required=True, help="the runtime's kubeconfig")
    parser.add_argument("--namespace", default=names.namespace, help="namespace of the secrets")
    parser.add_argument("--secret", default=names.config_secret, help="the token secret to read")
    parser.add_argument(
        "--certificate-secret",
        default=names.certificate_secret,
        help="where the client certificate, its chain and key go (in --namespace)",
    )
    parser.add_argument(
        "--ca-secret",
        default=None,
        help=f"namespace/name of the CA Secret (default {names.ca_secret}, as the module sets it)",
    )
    parser.add_argument(
        "--sync-period",
        type=float,
        default=None,
        help=f"the controller's resync period in seconds (default {defaults.sync_period:g}, "
        "the module's), jittered 0.9-1.1x",
    )
    parser.add_argument(
        "--minimal-sync",
        type=float,
        default=None,
        help=f"APP_MINIMAL_COMPASS_SYNC_TIME in seconds (default {defaults.minimal_sync:g})",
    )
    parser.add_argument(
        "--event-poll",
        type=float,
        default=defaults.event_poll,
        help="how often the CompassConnection is looked at for changes (its watch)",
    )
    parser.add_argument(
        "--until-connected",
        action="store_true",
        help="stop at Connected: no certificate-secured check, no Director sync",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=None,
        help="the earlier stand-in's option: sync period and minimal sync time (at least 1 s), "
        "the CA Secret in --namespace and --until-connected",
    )
    parser.add_argument("--log-level", default="INFO")
    return parser


def sim_from_args(api: client.ApiClient, args: argparse.Namespace) -> RuntimeAgentSim:
    legacy = args.interval is not None
    period = (
        args.sync_period
        if args.sync_period is not None
        else (args.interval if legacy else Timing.sync_period)
    )
    # Under a second Go's whole-second comparison never skips and every own update would trigger
    # the next attempt at once: the earlier option's minimal sync time is at least 1 s.
    minimal = (
        args.minimal_sync
        if args.minimal_sync is not None
        else (max(args.interval, 1.0) if legacy else Timing.minimal_sync)
    )
    ca_secret = args.ca_secret or (
        f"{args.namespace}/kyma-gateway-certs-cacert" if legacy else Names.ca_secret
    )
    return RuntimeAgentSim(
        api,
        names=Names(
            namespace=args.namespace,
            config_secret=args.secret,
            certificate_secret=args.certificate_secret,
            ca_secret=ca_secret,
        ),
        timing=Timing(sync_period=period, minimal_sync=minimal, event_poll=args.event_poll),
        until_connected=args.until_connected or legacy,
    )


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
    sim = sim_from_args(api, args)
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
