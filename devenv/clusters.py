"""Real, local Kubernetes API servers: etcd + kube-apiserver processes on loopback.

Started the way controller-runtime's envtest starts them (no kubelet, no controllers):
RBAC authorisation, a ServiceAccount issuer with its own signing key (so TokenRequest
and TokenReview work), a per-cluster CA for serving and client certificates, and an
admin client certificate in `system:masters`. Several clusters can run at once; each
has its own etcd, keys and ports, so a token of one is worthless on another.

A cluster owns its processes: `stop()` (or leaving the `running_cluster` context)
terminates them, and an `atexit` hook catches what a crashed test run left behind.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from devenv import pki

TOOLCHAIN_BUILD = Path(__file__).resolve().parent / "toolchain" / "build.sh"
CRD_DIR = Path(__file__).resolve().parent / "crds"

_STARTUP_TIMEOUT = 90.0
_live_processes: set[subprocess.Popen[bytes]] = set()


class ClusterError(RuntimeError):
    """A local cluster could not be started or used; the message says why."""


@dataclass(frozen=True)
class Binaries:
    folder: Path

    @property
    def kube_apiserver(self) -> Path:
        return self.folder / "kube-apiserver"

    @property
    def etcd(self) -> Path:
        return self.folder / "etcd"

    @property
    def helm(self) -> Path:
        return self.folder / "helm"

    @property
    def kubectl(self) -> Path:
        """kubectl of the same Kubernetes release as kube-apiserver (for operator commands)."""
        return self.folder / "kubectl"


def find_binaries() -> Binaries:
    """Returns the control-plane binaries, building them once into the user cache.

    `KUBEBUILDER_ASSETS` (the envtest convention) points at existing binaries instead.
    """
    result = subprocess.run(
        ["bash", str(TOOLCHAIN_BUILD)],
        stdout=subprocess.PIPE,
        stderr=None,  # progress of a long first build stays visible
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ClusterError(
            f"{TOOLCHAIN_BUILD} failed (exit {result.returncode}); see its output above"
        )
    return Binaries(Path(result.stdout.strip()))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _spawn(argv: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # A session of its own, so a Ctrl-C meant for pytest does not kill the
            # servers before the fixtures have stopped them in order.
            start_new_session=True,
        )
    _live_processes.add(proc)
    return proc


def terminate(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`: how every process devenv starts is stopped."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    _live_processes.discard(proc)


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_live_processes):
        terminate(proc, timeout=3.0)


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class TestCluster:
    """One running API server with its etcd, reachable as admin through `kubeconfig_path`."""

    __test__ = False  # a fixture type, not a test class, although tests import it

    name: str
    workdir: Path
    server: str
    port: int
    ca_file: Path
    kubeconfig_path: Path
    issuer: str
    etcd_url: str = ""  # plain HTTP on loopback: tests compact it to provoke 410 Gone
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    _api_client: client.ApiClient | None = field(default=None, repr=False)

    @property
    def kubeconfig_text(self) -> str:
        return self.kubeconfig_path.read_text()

    @property
    def api_client(self) -> client.ApiClient:
        if self._api_client is None:
            self._api_client = config.new_client_from_config(config_file=str(self.kubeconfig_path))
        return self._api_client

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api_client)

    @property
    def running(self) -> bool:
        return bool(self._processes) and all(p.poll() is None for p in self._processes)

    def stop(self) -> None:
        if self._api_client is not None:
            self._api_client.close()
            self._api_client = None
        # The API server first, so it does not log etcd connection errors on the way down.
        for proc in reversed(self._processes):
            terminate(proc)
        self._processes.clear()

    # -- helpers tests use often -------------------------------------------------

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        body = client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
        try:
            self.core.create_namespace(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
        return name

    def ensure_service_account(self, namespace: str, name: str) -> None:
        self.create_namespace(namespace)
        body = client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
        try:
            self.core.create_namespaced_service_account(namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def service_account_token(
        self,
        namespace: str,
        name: str,
        *,
        audiences: Sequence[str],
        expiration_seconds: int = 600,
    ) -> str:
        """A TokenRequest token for `namespace/name` (created if missing), like a kubelet's."""
        self.ensure_service_account(namespace, name)
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=list(audiences), expiration_seconds=expiration_seconds
            )
        )
        response = self.core.create_namespaced_service_account_token(name, namespace, request)
        assert response.status is not None
        return str(response.status.token)

    def kubeconfig_with_token(self, token: str, *, user: str = "token-user") -> str:
        """A kubeconfig that authenticates with a bearer token instead of the admin certificate."""
        ca_data = base64.b64encode(self.ca_file.read_bytes()).decode()
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": self.name,
                        "cluster": {"server": self.server, "certificate-authority-data": ca_data},
                    }
                ],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": user}}],
                "current-context": self.name,
            }
        )

    def publish_issuer_discovery(self) -> None:
        """Lets anonymous callers read the ServiceAccount issuer's discovery document and keys,
        as a self-managed cluster does to make its issuer usable from outside (BYOC enrolment).
        """
        binding = client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name="service-account-issuer-discovery-public"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io",
                kind="ClusterRole",
                name="system:service-account-issuer-discovery",
            ),
            subjects=[
                client.RbacV1Subject(
                    api_group="rbac.authorization.k8s.io",
                    kind="Group",
                    name="system:unauthenticated",
                )
            ],
        )
        try:
            client.RbacAuthorizationV1Api(self.api_client).create_cluster_role_binding(binding)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def apply_crds(self, paths: Sequence[Path], *, timeout: float = 30.0) -> None:
        """Creates (or replaces) CRDs and waits until each is Established and can be listed.

        Established alone is not enough: a fresh API server answers list and watch of a new
        resource with 429 "storage is (re)initializing" for a few seconds more.
        """
        ext = client.ApiextensionsV1Api(self.api_client)
        names = []
        served: list[tuple[str, str, str]] = []
        for path in paths:
            for doc in yaml.safe_load_all(path.read_text()):
                if not doc:
                    continue
                name = doc["metadata"]["name"]
                names.append(name)
                spec = doc["spec"]
                version = next(v["name"] for v in spec["versions"] if v.get("served", True))
                served.append((spec["group"], version, spec["names"]["plural"]))
                try:
                    ext.create_custom_resource_definition(doc)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    current = ext.read_custom_resource_definition(name)
                    assert current.metadata is not None
                    doc["metadata"]["resourceVersion"] = current.metadata.resource_version
                    ext.replace_custom_resource_definition(name, doc)
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                crd = ext.read_custom_resource_definition(name)
                conditions = (crd.status and crd.status.conditions) or []
                if any(c.type == "Established" and c.status == "True" for c in conditions):
                    break
                if time.monotonic() > deadline:
                    raise ClusterError(f"CRD {name} not established within {timeout}s")
                time.sleep(0.1)
        for group, version, plural in served:
            while True:
                try:
                    self.custom.list_cluster_custom_object(group, version, plural, limit=1)
                    break
                except ApiException as exc:
                    if exc.status not in (404, 429, 503) or time.monotonic() > deadline:
                        raise ClusterError(f"{plural}.{group} not served: {exc.status}") from exc
                time.sleep(0.2)


def kyma_crds() -> list[Path]:
    """The CRDs of the Kyma components this project reads: Kyma, ApplicationConnector, ...."""
    return sorted(CRD_DIR.glob("*.yaml"))


def _wait_ready(
    check: httpx.Client, url: str, procs: Sequence[subprocess.Popen[bytes]], logs: Sequence[Path]
) -> None:
    """Polls `url` until it answers 200; fails early, with the log's tail, when a process dies."""
    deadline = time.monotonic() + _STARTUP_TIMEOUT
    last = "no answer"
    while time.monotonic() < deadline:
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() is not None:
                raise ClusterError(f"{log.stem} exited with {proc.returncode}:\n{_log_tail(log)}")
        try:
            response = check.get(url)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}: {response.text[:200]}"
        except httpx.TransportError as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise ClusterError(
        f"{url} not ready after {_STARTUP_TIMEOUT}s ({last}):\n{_log_tail(logs[-1])}"
    )


def start_cluster(
    name: str,
    binaries: Binaries,
    *,
    workdir: Path | None = None,
    ca: pki.KeyPair | None = None,
    address: str = "127.0.0.1",
    server_hosts: Sequence[str] = (),
    apiserver_flags: Mapping[str, str | None] | None = None,
) -> TestCluster:
    """Starts etcd and kube-apiserver for one cluster and returns once `/readyz` answers 200.

    The defaults make an envtest-like API server on loopback. A real node (devenv/node) needs
    more, and passes it: `ca` (the cluster's CA, made by the caller, which issued the node's
    certificates from it first), `address` (where the API server binds and what it advertises,
    reachable from pods), `server_hosts` (more names and addresses in its serving certificate)
    and `apiserver_flags` (`--name` -> value, added or replacing the default; None drops it).
    """
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"kcp-{name}-"))
    pki_dir = workdir / "pki"
    pki_dir.mkdir(parents=True, exist_ok=True)

    ca = ca or pki.new_ca(f"{name}-ca")
    ca.write(pki_dir / "ca.crt", pki_dir / "ca.key")
    pki.issue(
        ca,
        common_name="kube-apiserver",
        server_hosts=tuple(
            dict.fromkeys(
                ("127.0.0.1", "localhost", "kubernetes.default.svc", address, *server_hosts)
            )
        ),
    ).write(pki_dir / "apiserver.crt", pki_dir / "apiserver.key")
    admin = pki.issue(ca, common_name="admin", organizations=("system:masters",), client=True)
    admin.write(pki_dir / "admin.crt", pki_dir / "admin.key")
    # RSA: what real clusters use for ServiceAccount tokens (RS256), and what JWKS clients expect.
    sa_key = pki.new_rsa_key()
    (pki_dir / "sa.key").write_bytes(pki.private_key_pem(sa_key))
    (pki_dir / "sa.key").chmod(0o600)
    (pki_dir / "sa.pub").write_bytes(pki.public_key_pem(sa_key))

    etcd_client, etcd_peer, api_port = free_port(), free_port(), free_port()
    server = f"https://{address}:{api_port}"
    issuer = f"{server}/"
    etcd_log, api_log = workdir / "etcd.log", workdir / "kube-apiserver.log"
    etcd = _spawn(
        [
            str(binaries.etcd),
            f"--name={name}",
            f"--data-dir={workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster={name}=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ],
        etcd_log,
    )
    cluster = TestCluster(
        name=name,
        workdir=workdir,
        server=server,
        port=api_port,
        ca_file=pki_dir / "ca.crt",
        kubeconfig_path=workdir / "admin.kubeconfig",
        issuer=issuer,
        etcd_url=f"http://127.0.0.1:{etcd_client}",
        _processes=[etcd],
    )
    try:
        with httpx.Client(timeout=2.0) as plain:
            _wait_ready(plain, f"http://127.0.0.1:{etcd_client}/health", [etcd], [etcd_log])
        flags: dict[str, str | None] = {
            "--etcd-servers": f"http://127.0.0.1:{etcd_client}",
            "--cert-dir": str(pki_dir),
            "--tls-cert-file": str(pki_dir / "apiserver.crt"),
            "--tls-private-key-file": str(pki_dir / "apiserver.key"),
            "--client-ca-file": str(pki_dir / "ca.crt"),
            "--secure-port": str(api_port),
            "--bind-address": address,
            "--advertise-address": address,
            # No kubelet or real network here: nothing should maintain the kubernetes Service.
            "--endpoint-reconciler-type": "none",
            "--service-cluster-ip-range": "10.0.0.0/24",
            "--allow-privileged": "true",
            "--disable-admission-plugins": "ServiceAccount",
            "--authorization-mode": "RBAC",
            "--service-account-issuer": issuer,
            "--service-account-key-file": str(pki_dir / "sa.pub"),
            "--service-account-signing-key-file": str(pki_dir / "sa.key"),
            "--enable-priority-and-fairness": "false",
            "--profiling": "false",
            "--v": "0",
        }
        flags.update(apiserver_flags or {})
        apiserver = _spawn(
            [str(binaries.kube_apiserver)]
            + [f"{flag}={value}" for flag, value in flags.items() if value is not None],
            api_log,
        )
        cluster._processes.append(apiserver)
        tls = ssl.create_default_context(cafile=str(pki_dir / "ca.crt"))
        tls.load_cert_chain(str(pki_dir / "admin.crt"), str(pki_dir / "admin.key"))
        with httpx.Client(timeout=2.0, verify=tls) as admin_http:
            _wait_ready(admin_http, f"{server}/readyz", [etcd, apiserver], [etcd_log, api_log])
    except BaseException:
        cluster.stop()
        raise

    cluster.kubeconfig_path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": name,
                        "cluster": {
                            "server": server,
                            "certificate-authority-data": base64.b64encode(ca.cert_pem).decode(),
                        },
                    }
                ],
                "users": [
                    {
                        "name": "admin",
                        "user": {
                            "client-certificate-data": base64.b64encode(admin.cert_pem).decode(),
                            "client-key-data": base64.b64encode(admin.key_pem).decode(),
                        },
                    }
                ],
                "contexts": [{"name": name, "context": {"cluster": name, "user": "admin"}}],
                "current-context": name,
            }
        )
    )
    cluster.kubeconfig_path.chmod(0o600)
    return cluster


@contextlib.contextmanager
def running_cluster(
    name: str, binaries: Binaries | None = None, *, keep_workdir: bool = False
) -> Iterator[TestCluster]:
    """A cluster in a new temporary folder, removed with everything in it (etcd's data, the
    CA's and the ServiceAccount issuer's private keys, logs: tens of MB) once the cluster has
    stopped, also when it failed to start; `keep_workdir` or KEEP_CLUSTER_WORKDIRS keep it."""
    workdir = Path(tempfile.mkdtemp(prefix=f"kcp-{name}-"))
    try:
        cluster = start_cluster(name, binaries or find_binaries(), workdir=workdir)
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        if not keep_workdir and not os.environ.get("KEEP_CLUSTER_WORKDIRS"):
            shutil.rmtree(workdir, ignore_errors=True)


class _Stopped(Exception):
    """Raised in the main thread by SIGINT, SIGTERM or SIGHUP: unwinds to the cluster's stop()."""


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM (and SIGHUP, unless nohup ignores it) unwind `main` so the processes
    it started are stopped. Set explicitly: a shell starts a background job with SIGINT ignored,
    which Python then leaves ignored, and SIGTERM's default ends Python without any cleanup
    (etcd and kube-apiserver, in sessions of their own, kept running)."""

    def stop(signum: int, _frame: object) -> None:
        # Once: a second signal must not cut the stopping short and leave a process behind.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        raise _Stopped(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, stop)


def main() -> int:
    """`python -m devenv.clusters`: start one cluster and print its kubeconfig path until
    SIGINT (Ctrl-C) or SIGTERM, which stop etcd and kube-apiserver and remove the cluster's
    temporary folder before it exits."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--name", default="dev")
    parser.add_argument(
        "--keep-workdir",
        action="store_true",
        help="leave the cluster's folder (etcd data, keys, logs) behind for a look after it stops",
    )
    args = parser.parse_args()
    _stop_on_signals()
    binaries = find_binaries()
    try:
        with running_cluster(args.name, binaries, keep_workdir=args.keep_workdir) as cluster:
            print(
                f"{cluster.name}: {cluster.server}  KUBECONFIG={cluster.kubeconfig_path}"
                f"  kubectl: {binaries.kubectl}",
                flush=True,
            )
            while True:
                signal.pause()
    except _Stopped as stopped:
        print(f"{args.name}: stopped ({stopped})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
