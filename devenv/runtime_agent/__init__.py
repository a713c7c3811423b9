"""Kyma's real compass-runtime-agent as a local process against a test API server.

`build.sh` builds the binary from the pinned application-connector-manager source (exit 3: no
source here). `RealRuntimeAgent` runs it the way the application-connector module runs it, as
far as a laptop allows:

- its own ServiceAccount `kyma-system/compass-runtime-agent` with the least RBAC the agent needs
  (`install()`; rules below), authenticated by a TokenRequest token in a kubeconfig — never the
  admin certificate;
- the module Deployment's environment (`APP_*`), with the sync period the caller chooses;
- in a private mount namespace (`unshare -m`, root only): `cmd/init.go` builds an in-cluster
  client unconditionally and the process exits when that fails, so a tmpfs on `/run` holds a
  dummy ServiceAccount token and `KUBERNETES_SERVICE_HOST/PORT` point at the test API server.
  Nothing on the host changes. The agent's own API calls use `KUBECONFIG`.

controller-runtime's metrics server binds `:8080` and the agent has no setting for it, so only
one real agent runs per machine: `start()` holds an exclusive lock file for the process's life
(and waits for it up to `lock_timeout`).

RBAC, derived from what the agent reads and writes at 859cac3 (the source has no manifests):
CompassConnections get/list/watch/create/update (cluster-wide: its informer lists them all);
Applications get/list/create/update/delete (cluster-scoped kind, synced from Director); Secrets
get/create/update/delete in the agent's namespace (the configuration Secret, its client
certificate, the applications' credentials) and get/create/update in the CA Secret's namespace.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devenv.clusters import TestCluster, free_port

__all__ = [
    "AGENT_NAMESPACE",
    "CA_SECRET",
    "CERTIFICATE_SECRET",
    "CONFIG_SECRET",
    "RealRuntimeAgent",
    "RuntimeAgentUnavailable",
    "build",
    "install",
]

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
APPLICATIONS_CRD = HERE / "applications.crd.yaml"
SOURCE_MISSING = 3  # build.sh's exit code when the source cannot be had

AGENT_NAMESPACE = "kyma-system"
SERVICE_ACCOUNT = "compass-runtime-agent"
CONFIG_SECRET = f"{AGENT_NAMESPACE}/compass-agent-configuration"
CERTIFICATE_SECRET = f"{AGENT_NAMESPACE}/cluster-client-certificates"
# The namespace must exist, or the agent loses the certificate after spending the token.
CA_SECRET = "istio-system/kyma-gateway-certs-cacert"  # noqa: S105 - a name, not a password
METRICS_PORT = 8080
DUMMY_TOKEN_DIR = "/run/secrets/kubernetes.io/serviceaccount"  # noqa: S105 - a path


class RuntimeAgentUnavailable(RuntimeError):
    """The real agent cannot run here; `reason` says why (tests skip with it)."""

    def __init__(self, reason: str, *, source_missing: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.source_missing = source_missing


def build(*, timeout: float = 1800) -> Path:
    """The folder holding `compass-runtime-agent`, building it first when needed."""
    try:
        done = subprocess.run(
            ["bash", str(BUILD_SCRIPT)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeAgentUnavailable(
            f"building compass-runtime-agent took over {timeout:g}s"
        ) from exc
    if done.returncode == SOURCE_MISSING:
        raise RuntimeAgentUnavailable(done.stderr.strip(), source_missing=True)
    if done.returncode != 0:
        raise RuntimeAgentUnavailable(
            f"building compass-runtime-agent failed (exit {done.returncode}): "
            + done.stderr.strip()[-2000:]
        )
    return Path(done.stdout.strip())


def _create(make: object, *args: object) -> None:
    assert callable(make)
    try:
        make(*args)
    except ApiException as exc:
        if exc.status != 409:
            raise


def install(cluster: TestCluster, *, token_seconds: int = 24 * 3600) -> str:
    """Namespaces, the Application CRD, the agent's ServiceAccount and RBAC; returns a
    kubeconfig that authenticates as that ServiceAccount."""
    cluster.apply_crds([APPLICATIONS_CRD])
    ca_namespace = CA_SECRET.split("/", 1)[0]
    for namespace in (AGENT_NAMESPACE, ca_namespace):
        cluster.create_namespace(namespace)
    cluster.ensure_service_account(AGENT_NAMESPACE, SERVICE_ACCOUNT)
    rbac = client.RbacAuthorizationV1Api(cluster.api_client)
    rule = client.V1PolicyRule
    subject = client.RbacV1Subject(
        kind="ServiceAccount", name=SERVICE_ACCOUNT, namespace=AGENT_NAMESPACE
    )
    _create(
        rbac.create_cluster_role,
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=SERVICE_ACCOUNT),
            rules=[
                rule(
                    api_groups=["compass.kyma-project.io"],
                    resources=["compassconnections"],
                    verbs=["get", "list", "watch", "create", "update"],
                ),
                rule(
                    api_groups=["applicationconnector.kyma-project.io"],
                    resources=["applications"],
                    verbs=["get", "list", "create", "update", "delete"],
                ),
            ],
        ),
    )
    _create(
        rbac.create_cluster_role_binding,
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=SERVICE_ACCOUNT),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=SERVICE_ACCOUNT
            ),
            subjects=[subject],
        ),
    )
    for namespace, verbs in (
        (AGENT_NAMESPACE, ["get", "create", "update", "delete"]),
        (ca_namespace, ["get", "create", "update"]),
    ):
        _create(
            rbac.create_namespaced_role,
            namespace,
            client.V1Role(
                metadata=client.V1ObjectMeta(name=SERVICE_ACCOUNT),
                rules=[rule(api_groups=[""], resources=["secrets"], verbs=verbs)],
            ),
        )
        _create(
            rbac.create_namespaced_role_binding,
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name=SERVICE_ACCOUNT),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="Role", name=SERVICE_ACCOUNT
                ),
                subjects=[subject],
            ),
        )
    token = cluster.service_account_token(
        AGENT_NAMESPACE,
        SERVICE_ACCOUNT,
        audiences=[cluster.issuer],
        expiration_seconds=token_seconds,
    )
    return cluster.kubeconfig_with_token(token, user=SERVICE_ACCOUNT)


def _lock_path() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kyma-compass-pull" / "runtime-agent" / "metrics-port.lock"


@contextlib.contextmanager
def _machine_lock(timeout: float) -> Iterator[None]:
    path = _lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    handle: IO[str] = path.open("a")
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeAgentUnavailable(
                        f"another real compass-runtime-agent holds {path} (it needs port "
                        f"{METRICS_PORT}) for more than {timeout:g}s"
                    ) from None
                time.sleep(0.5)
        yield
    finally:
        handle.close()


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("::", port))
        except OSError:
            return False
    return True


@dataclass
class RealRuntimeAgent:
    """One compass-runtime-agent process; `start()` … `stop()` or a `with` block."""

    cluster: TestCluster
    binary_dir: Path
    workdir: Path
    sync_period: float = 180.0
    minimal_sync: float = 15.0
    query_logging: bool = False
    lock_timeout: float = 600.0
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _lock: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, init=False)

    @property
    def log_path(self) -> Path:
        return self.workdir / "compass-runtime-agent.log"

    def environment(self, kubeconfig: Path) -> dict[str, str]:
        """The module Deployment's environment, with the test's sync period."""
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workdir),
            "KUBECONFIG": str(kubeconfig),
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self.cluster.port),
            "APP_AGENT_CONFIGURATION_SECRET": CONFIG_SECRET,
            "APP_CONTROLLER_SYNC_PERIOD": f"{self.sync_period:g}s",
            "APP_MINIMAL_COMPASS_SYNC_TIME": f"{self.minimal_sync:g}s",
            "APP_CLUSTER_CERTIFICATES_SECRET": CERTIFICATE_SECRET,
            "APP_CA_CERTIFICATES_SECRET": CA_SECRET,
            "APP_SKIP_COMPASS_TLS_VERIFY": "true",
            # On errors it logs request headers, the Connector-Token among them.
            "APP_QUERY_LOGGING": "true" if self.query_logging else "false",
            "APP_HEALTH_PORT": str(free_port()),
        }

    def start(self) -> Self:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            raise RuntimeAgentUnavailable(
                "running compass-runtime-agent outside a pod needs root and unshare(1) "
                "(a private mount namespace for its in-cluster ServiceAccount token)"
            )
        binary = self.binary_dir / "compass-runtime-agent"
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.workdir / "runtime-agent.kubeconfig"
        kubeconfig.write_text(install(self.cluster))
        kubeconfig.chmod(0o600)
        self._lock.enter_context(_machine_lock(self.lock_timeout))
        try:
            if not _port_free(METRICS_PORT):
                raise RuntimeAgentUnavailable(
                    f"port {METRICS_PORT} is taken: compass-runtime-agent's metrics server needs it"
                )
            script = (
                "mount -t tmpfs -o size=1m,mode=755 runtime-agent-run /run"
                f" && mkdir -p {DUMMY_TOKEN_DIR}"
                f" && printf dummy > {DUMMY_TOKEN_DIR}/token"
                ' && exec "$0"'
            )
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, binary],
                    env=self.environment(kubeconfig),
                    cwd=self.workdir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        except BaseException:
            self._lock.close()
            raise
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 15) -> None:
        proc, self.process = self.process, None
        try:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout)
        finally:
            self._lock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
