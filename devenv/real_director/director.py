"""The Director process: its configuration, the Kubernetes objects it reads, start and stop.

Director reads its configuration from about ninety `APP_*` variables, most of them mandatory
(envconfig without defaults) although the Kyma runtime flows never use them: tenant fetching,
self-registration, destinations, ORD, formations. Those get inert values here (local URLs that
nothing calls, empty JSON documents). The names and the local values they take are the facts of
`components/director/run.sh` in the pinned source.

At start Director reads and watches one ConfigMap (pairing adapters) and watches one Secret
(the external client certificate) through the API server it finds in `$HOME/.kube/config`.
Both live in a namespace of their own, so a shared test cluster is not disturbed.
"""

from __future__ import annotations

import base64
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devenv import pki
from devenv.clusters import TestCluster, free_port, terminate

_READY_TIMEOUT = 120.0
PAIRING_CM_NAME = "pairing-adapter-config"
PAIRING_CM_KEY = "config.json"
CLIENT_CERT_SECRET = "external-client-certificate"  # noqa: S105 - a Secret's name
SYSTEM_FETCHER_KEYS_SECRET = "system-fetcher-external-keys"  # noqa: S105 - a Secret's name


class DirectorError(RuntimeError):
    """Director could not be started; the message says why (with its log's tail)."""


@dataclass(frozen=True)
class DirectorConfig:
    binary: Path
    source: Path  # the unpacked `compass/` tree
    db_port: int
    schema_version: int
    jwks_url: str
    public_url: str  # where callers reach Director (the gateway)
    token_url: str
    connector_url: str
    namespace: str
    # Director's configuration file (scopes per operation); default: the tree's local one.
    configuration_file: Path | None = None


def local_configuration(source: Path) -> Path:
    """The tree's configuration file for a local Director (`hack/config-local.yaml`)."""
    return source / "components/director/hack/config-local.yaml"


def _placeholder_files(folder: Path) -> dict[str, Path]:
    """The JSON files Director insists on reading; `{}` is a valid "nothing configured"."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in (
        "tenant-mapping-config.json",
        "dependencies.json",
        "self-register-keys.json",
        "self-register-saas-apps.json",
    ):
        path = folder / name
        path.write_text("{}")
        files[name] = path
    return files


def director_environment(
    cfg: DirectorConfig, workdir: Path, ports: dict[str, int], *, root_ca_pem: str
) -> dict[str, str]:
    files = _placeholder_files(workdir / "config")
    nowhere = "http://127.0.0.1:9"  # discard port: URLs Director needs set but never calls here
    ns = cfg.namespace
    return {
        # -- listeners (defaults are fixed ports, which would clash) ----------------------
        "APP_ADDRESS": f"127.0.0.1:{ports['api']}",
        "APP_INTERNAL_ADDRESS": f"127.0.0.1:{ports['internal']}",
        "APP_METRICS_ADDRESS": f"127.0.0.1:{ports['metrics']}",
        "APP_URL": f"{cfg.public_url}/director",
        # -- database ---------------------------------------------------------------------
        "APP_DB_USER": "postgres",
        "APP_DB_PASSWORD": "unused-trust-auth",
        "APP_DB_HOST": "127.0.0.1",
        "APP_DB_PORT": str(cfg.db_port),
        "APP_DB_NAME": "compass",
        "APP_DB_SSL": "disable",
        "APP_DB_MAX_OPEN_CONNECTIONS": "20",
        "APP_DB_MAX_IDLE_CONNECTIONS": "20",
        "APP_SCHEMA_MIGRATION_VERSION": str(cfg.schema_version),
        # -- authentication: the gateway signs, Director verifies -------------------------
        "APP_JWKS_ENDPOINT": cfg.jwks_url,
        "APP_ALLOW_JWT_SIGNING_NONE": "false",
        "APP_CONFIGURATION_FILE": str(cfg.configuration_file or local_configuration(cfg.source)),
        "APP_OAUTH20_URL": nowhere,
        "APP_OAUTH20_PUBLIC_ACCESS_TOKEN_ENDPOINT": cfg.token_url,
        "APP_SUGGEST_TOKEN_HTTP_HEADER": "suggest_token",
        "APP_INFO_ROOT_CA": root_ca_pem,  # shown by /info only
        # -- the one-time token: its connectorURL is this, verbatim -----------------------
        "APP_CONNECTOR_URL": cfg.connector_url,
        "APP_ONE_TIME_TOKEN_URL": cfg.connector_url,
        "APP_LEGACY_CONNECTOR_URL": f"{nowhere}/v1/applications/signingRequests/info",
        # -- modes: synchronous, no tenant fetching on demand (tenants are rows we write) --
        "APP_DISABLE_ASYNC_MODE": "true",
        "APP_DISABLE_TENANT_ON_DEMAND_MODE": "true",
        "APP_LOG_LEVEL": "info",
        "APP_LOG_FORMAT": "text",
        "APP_HTTP_RETRY_ATTEMPTS": "3",
        "APP_HTTP_RETRY_DELAY": "100ms",
        "APP_HEALTH_CONFIG_INDICATORS": "{database,5s,1s,1s,3}",
        # -- Kubernetes objects Director watches ------------------------------------------
        "APP_PAIRING_ADAPTER_CM_NAME": PAIRING_CM_NAME,
        "APP_PAIRING_ADAPTER_CM_NAMESPACE": ns,
        "APP_PAIRING_ADAPTER_CM_KEY": PAIRING_CM_KEY,
        "APP_PAIRING_ADAPTER_WATCHER_ID": "pairing-adapter-watcher-id",
        "APP_EXTERNAL_CLIENT_CERT_SECRET": f"{ns}/{CLIENT_CERT_SECRET}",
        "APP_EXTERNAL_CLIENT_CERT_SECRET_NAME": CLIENT_CERT_SECRET,
        "APP_EXTERNAL_CLIENT_CERT_KEY": "tls.crt",
        "APP_EXTERNAL_CLIENT_KEY_KEY": "tls.key",
        "APP_SYSTEM_FETCHER_EXTERNAL_KEYS_SECRET": f"{ns}/{SYSTEM_FETCHER_KEYS_SECRET}",
        "APP_SYSTEM_FETCHER_EXTERNAL_KEYS_SECRET_NAME": SYSTEM_FETCHER_KEYS_SECRET,
        "APP_SYSTEM_FETCHER_EXTERNAL_KEYS_SECRET_DATA_KEY": "data",
        "APP_OPERATIONS_NAMESPACE": ns,
        # -- features the Kyma flows do not use: inert values -----------------------------
        "APP_SELF_REGISTER_DISTINGUISH_LABEL_KEY": "non-existent-label-key",
        "APP_SELF_REGISTER_SECRET_PATH": str(files["self-register-keys.json"]),
        "APP_SELF_REGISTER_SAAS_APP_SECRET_PATH": str(files["self-register-saas-apps.json"]),
        "APP_SELF_REGISTER_INSTANCE_CLIENT_ID_PATH": "clientId",
        "APP_SELF_REGISTER_INSTANCE_CLIENT_SECRET_PATH": "clientSecret",
        "APP_SELF_REGISTER_INSTANCE_URL_PATH": "url",
        "APP_SELF_REGISTER_INSTANCE_TOKEN_URL_PATH": "tokenUrl",
        "APP_SELF_REGISTER_INSTANCE_X509_CERT_PATH": "clientCert",
        "APP_SELF_REGISTER_INSTANCE_X509_KEY_PATH": "clientKey",
        "APP_SELF_REGISTER_SAAS_APP_NAME_PATH": "localSaaSAppNamePath",
        "APP_SYSTEM_FIELD_DISCOVERY_SAAS_REGISTRY_URL_PATH": "localSaaSRegistryPath",
        "APP_ORD_WEBHOOK_MAPPINGS": "[]",
        "APP_TENANT_MAPPING_CONFIG_PATH": str(files["tenant-mapping-config.json"]),
        "APP_TENANT_MAPPING_CALLBACK_URL": nowhere,
        "APP_TENANT_REGION_DEPENDENCIES_CONFIG_PATH": str(files["dependencies.json"]),
        "APP_APPLICATION_TEMPLATE_PRODUCT_LABEL": "systemRole",
        "APP_SUBSCRIPTION_CALLBACK_SCOPE": "Callback",
        "APP_FORMATION_MAPPING_API_PATH_PREFIX": "/v1/businessIntegrations",
        "APP_FORMATION_ASSIGNMENT_ASYNC_STATUS_API_ENDPOINT": (
            "/{ucl-formation-id}/assignments/{ucl-assignment-id}/status"
        ),
        "APP_FORMATION_ASSIGNMENT_ASYNC_STATUS_RESET_API_ENDPOINT": (
            "/{ucl-formation-id}/assignments/{ucl-assignment-id}/status/reset"
        ),
        "APP_FORMATION_ASYNC_STATUS_API_ENDPOINT": "/{ucl-formation-id}/status",
        "APP_UCL_CERT_OU_SUBACCOUNT_ID": str(uuid.uuid4()),
        "APP_DESTINATION_CREATOR_CORRELATION_IDS_KEY": "correlationIds",
        "APP_DESTINATION_CREATOR_DESTINATION_BASE_URL": nowhere,
        "APP_DESTINATION_CREATOR_DESTINATION_PATH": (
            "/regions/{region}/subaccounts/{subaccountId}/destinations"
        ),
        "APP_DESTINATION_CREATOR_DESTINATION_REGION_PARAMETER": "region",
        "APP_DESTINATION_CREATOR_DESTINATION_SUBACCOUNT_ID_PARAMETER": "subaccountId",
        "APP_DESTINATION_CREATOR_DESTINATION_NAME_PARAMETER": "destinationName",
        "APP_DESTINATION_CREATOR_DESTINATION_INSTANCE_LEVEL_PATH": (
            "/regions/{region}/subaccounts/{subaccountId}/instances/{instanceId}/destinations"
        ),
        "APP_DESTINATION_CREATOR_DESTINATION_INSTANCE_ID_PARAMETER": "instanceId",
        "APP_DESTINATION_CREATOR_CERTIFICATE_BASE_URL": nowhere,
        "APP_DESTINATION_CREATOR_CERTIFICATE_PATH": (
            "/regions/{region}/subaccounts/{subaccountId}/certificates"
        ),
        "APP_DESTINATION_CREATOR_CERTIFICATE_REGION_PARAMETER": "region",
        "APP_DESTINATION_CREATOR_CERTIFICATE_SUBACCOUNT_ID_PARAMETER": "subaccountId",
        "APP_DESTINATION_CREATOR_CERTIFICATE_NAME_PARAMETER": "certificateName",
        "APP_DESTINATION_CREATOR_CERTIFICATE_FILE_NAME_KEY": "fileName",
        "APP_DESTINATION_CREATOR_CERTIFICATE_COMMON_NAME_KEY": "commonName",
        "APP_DESTINATION_CREATOR_CERTIFICATE_CERT_CHAIN_KEY": "certificateChain",
        "APP_DESTINATION_CREATOR_CERTIFICATE_INSTANCE_LEVEL_PATH": (
            "/regions/{region}/subaccounts/{subaccountId}/instances/{instanceId}/certificates"
        ),
        "APP_DESTINATION_CREATOR_CERTIFICATE_INSTANCE_ID_PARAMETER": "instanceId",
        "APP_ORD_AGGREGATOR_AGGREGATE_API": f"{nowhere}/ord-aggregator/aggregate",
        "APP_SYSTEM_FETCHER_SYNC_API": f"{nowhere}/system-fetcher/sync",
        "APP_SYSTEM_FIELD_DISCOVERY_ENGINE_SAAS_REGISTRY_API": f"{nowhere}/tenants/sfd",
    }


def prepare_cluster_objects(cluster: TestCluster, namespace: str) -> str:
    """The namespace, ConfigMap and Secrets Director reads at start; returns the CA's PEM."""
    core = cluster.core
    cluster.create_namespace(namespace)
    ca = pki.new_ca("real-director-external-client")
    cert = pki.issue(ca, common_name="real-director-external-client", client=True)
    objects: list[client.V1ConfigMap | client.V1Secret] = [
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=PAIRING_CM_NAME), data={PAIRING_CM_KEY: "{}"}
        ),
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=CLIENT_CERT_SECRET),
            data={
                "tls.crt": base64.b64encode(cert.cert_pem).decode(),
                "tls.key": base64.b64encode(cert.key_pem).decode(),
            },
        ),
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=SYSTEM_FETCHER_KEYS_SECRET),
            data={"data": base64.b64encode(b"{}").decode()},
        ),
    ]
    for obj in objects:
        try:
            if isinstance(obj, client.V1ConfigMap):
                core.create_namespaced_config_map(namespace, obj)
            else:
                core.create_namespaced_secret(namespace, obj)
        except ApiException as exc:
            if exc.status != 409:
                raise
    return ca.cert_pem.decode()


@dataclass
class DirectorProcess:
    url: str  # Director's own base URL (http://127.0.0.1:port), GraphQL at /graphql
    log_path: Path
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def graphql_url(self) -> str:
        return f"{self.url}/graphql"

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate(proc, timeout=timeout)


def start_director(cfg: DirectorConfig, cluster: TestCluster, workdir: Path) -> DirectorProcess:
    """Starts Director and returns once `/readyz` answers 200."""
    home = workdir / "home"
    (home / ".kube").mkdir(parents=True, exist_ok=True)
    (home / ".kube" / "config").write_text(cluster.kubeconfig_text)
    (home / ".kube" / "config").chmod(0o600)
    root_ca_pem = prepare_cluster_objects(cluster, cfg.namespace)
    ports = {"api": free_port(), "internal": free_port(), "metrics": free_port()}
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        # Director finds the API server through $HOME/.kube/config (client-go's default).
        "HOME": str(home),
        **director_environment(cfg, workdir, ports, root_ca_pem=root_ca_pem),
    }
    log_path = workdir / "director.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(cfg.binary)],
            env=env,
            cwd=str(workdir),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    director = DirectorProcess(
        url=f"http://127.0.0.1:{ports['api']}", log_path=log_path, _proc=proc
    )
    deadline = time.monotonic() + _READY_TIMEOUT
    last = "no answer"
    with httpx.Client(timeout=2.0) as http:
        while True:
            if proc.poll() is not None:
                director.stop()
                raise DirectorError(
                    f"Director exited with {proc.returncode} during start:\n{_tail(log_path)}"
                )
            try:
                response = http.get(f"{director.url}/readyz")
                if response.status_code == 200:
                    return director
                last = f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.TransportError as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                director.stop()
                raise DirectorError(
                    f"Director not ready after {_READY_TIMEOUT}s ({last}):\n{_tail(log_path)}"
                )
            time.sleep(0.1)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
