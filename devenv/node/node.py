"""A devenv cluster with a real node: etcd and kube-apiserver (devenv.clusters) plus
kube-controller-manager, kube-scheduler, containerd (with runc and the CNI bridge plugin),
kube-proxy and the kubelet, all as local processes of this machine.

Only one node runs on a machine at a time: cgroups, a few host paths and the pod network are
host-wide. A lock file says so, and a state file next to it keeps the host snapshot taken before
the node started, so a run that was killed is cleaned up by the next start (or by
`python -m devenv.node --clean`).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import urllib3
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devenv import clusters, pki
from devenv.node import host, images

NODE_NAME = "kcp-node"
BRIDGE = "kcpnode0"
POD_CIDR = "10.77.0.0/16"
# The bridge's address: the gateway of every pod, and where the API server listens for the node.
HOST_IP = "10.77.0.1"
SERVICE_CIDR = "10.0.0.0/24"  # devenv.clusters' --service-cluster-ip-range
KUBERNETES_SERVICE_IP = "10.0.0.1"
# The node's own nft table: pods reach this host (the API server, a broker on HOST_IP) and
# nothing beyond it, whatever the routes and the forwarding sysctl say.
GUARD_TABLE = "kyma_compass_pull_node"

_STATE_DIR = Path("/run/kyma-compass-pull-node")
_STARTUP_TIMEOUT = 90.0
_live_nodes: list[NodeCluster] = []


class NodeError(RuntimeError):
    """The node could not be started, used or stopped; the message says why."""


class NodeUnavailable(NodeError):
    """This machine cannot run a node (not root, no containerd, no cgroups): tests skip."""


class NodeBusy(NodeError):
    """Another process runs this machine's one node (another test run on a shared machine)."""


@dataclass(frozen=True)
class NodeBinaries:
    folder: Path

    def __getitem__(self, name: str) -> Path:
        return self.folder / name

    @property
    def cluster(self) -> clusters.Binaries:
        return clusters.Binaries(self.folder)


def find_node_binaries() -> NodeBinaries:
    """The toolchain's folder with kubelet, kube-controller-manager, kube-scheduler and
    kube-proxy next to kube-apiserver and etcd, building what is missing (`make node` does it
    before the tests)."""
    result = subprocess.run(
        ["bash", str(clusters.TOOLCHAIN_BUILD), "node"],
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise NodeError(f"{clusters.TOOLCHAIN_BUILD} node failed (exit {result.returncode})")
    return NodeBinaries(Path(result.stdout.strip()))


@dataclass
class NodeCluster:
    """A running cluster with one real node. `cluster` is the devenv.clusters handle (admin
    kubeconfig, API clients); the node's processes, logs and figures are here."""

    cluster: clusters.TestCluster
    workdir: Path
    containerd_socket: Path
    timings: dict[str, float] = field(default_factory=dict)
    _processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _before: host.HostSnapshot | None = field(default=None, repr=False)
    _lock: IO[str] | None = field(default=None, repr=False)
    stop_report: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return NODE_NAME

    @property
    def host_ip(self) -> str:
        return HOST_IP

    @property
    def running(self) -> bool:
        return (
            bool(self._processes)
            and all(p.poll() is None for p in self._processes.values())
            and self.cluster.running
        )

    def log_path(self, component: str) -> Path:
        return self.workdir / "node" / f"{component}.log"

    def log_tail(self, component: str, lines: int = 40) -> str:
        return clusters._log_tail(self.log_path(component), lines)

    def import_image(self, archive: Path) -> list[str]:
        """Imports an image archive (OCI or Docker, e.g. devenv/image.py's) with ctr; pods then
        run it with imagePullPolicy Never or IfNotPresent."""
        return images.import_archive(self.containerd_socket, archive)

    def images(self) -> list[str]:
        result = subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", "images", "ls", "-q"],
            capture_output=True,
            text=True,
            check=False,
        )
        return result.stdout.split()

    def tasks(self) -> list[str]:
        """The containerd tasks (pod sandboxes and containers) alive on the node."""
        result = subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", "tasks", "ls", "-q"],
            capture_output=True,
            text=True,
            check=False,
        )
        return result.stdout.split()

    def memory(self) -> dict[str, tuple[int, int]]:
        """Per component: (current RSS, peak RSS) in KiB, from /proc/<pid>/status."""
        found = {}
        procs = dict(self._processes)
        if len(self.cluster._processes) == 2:
            procs["etcd"], procs["kube-apiserver"] = self.cluster._processes
        for name, proc in procs.items():
            values = {}
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    key, _, rest = line.partition(":")
                    if key in ("VmRSS", "VmHWM"):
                        values[key] = int(rest.split()[0])
            if values:
                found[name] = (values.get("VmRSS", 0), values.get("VmHWM", 0))
        return found

    def stop(self) -> list[str]:
        """Stops pods, the node's processes and the API server, then undoes what the node left on
        the host (processes, mounts, network namespaces, links, nft tables, cgroups, sysctls, host
        paths). Returns one line per thing it had to undo by force."""
        if self in _live_nodes:
            _live_nodes.remove(self)
        report: list[str] = []
        try:
            if self._processes and self.cluster.running:
                try:
                    report += _drain_pods(self)
                except Exception as exc:  # stopping goes on: the restore below cleans up
                    report.append(f"pods not drained: {exc!r}")
            for name in ("kubelet", "kube-proxy", "kube-scheduler", "kube-controller-manager"):
                proc = self._processes.pop(name, None)
                if proc is not None:
                    clusters.terminate(proc)
            proc = self._processes.pop("containerd", None)
            if proc is not None:
                clusters.terminate(proc)
            self.cluster.stop()
            if self._before is not None:
                before, self._before = self._before, None
                report += host.restore(
                    before,
                    workdir=self.workdir,
                    markers=[str(self.containerd_socket)],
                    bridge=BRIDGE,
                )
        finally:
            _release(self._lock)
            self._lock = None
        self.stop_report = report
        if not os.environ.get("KEEP_CLUSTER_WORKDIRS"):
            shutil.rmtree(self.workdir, ignore_errors=True)
        return report


def _drain_pods(node: NodeCluster, timeout: float = 40.0) -> list[str]:
    """Deletes every pod (1 s grace) and waits until the kubelet has stopped their containers and
    sandboxes, so the CNI plugin releases their addresses and veths the ordinary way."""
    core = node.cluster.core
    try:
        pods = core.list_pod_for_all_namespaces().items
    except (ApiException, OSError, urllib3.exceptions.HTTPError):
        return ["pods not drained: the API server did not answer"]
    for pod in pods:
        assert pod.metadata is not None
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(
                str(pod.metadata.name), str(pod.metadata.namespace), grace_period_seconds=1
            )
    # Controllers would make new pods: stop them first (the ReplicaSets stay, nothing acts on them).
    proc = node._processes.pop("kube-controller-manager", None)
    if proc is not None:
        clusters.terminate(proc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            left = core.list_pod_for_all_namespaces().items
        except ApiException:
            left = []
        for pod in left:
            assert pod.metadata is not None
            if pod.metadata.deletion_timestamp is None:
                with contextlib.suppress(ApiException):
                    core.delete_namespaced_pod(
                        str(pod.metadata.name), str(pod.metadata.namespace), grace_period_seconds=1
                    )
        if not left and not node.tasks():
            return []
        time.sleep(0.5)
    return [f"pods not drained within {timeout}s: {len(node.tasks())} containerd tasks left"]


def _acquire_machine_lock() -> IO[str]:
    _STATE_DIR.mkdir(parents=True, exist_ok=True)
    lock = (_STATE_DIR / "lock").open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise NodeBusy(f"a node already runs on this machine ({holder}); one at a time") from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()}\n")
    lock.flush()
    return lock


def _release(lock: IO[str] | None) -> None:
    if lock is None:
        return
    with contextlib.suppress(OSError):
        (_STATE_DIR / "state.json").unlink()
    with contextlib.suppress(OSError):
        lock.close()
    with contextlib.suppress(OSError):
        (_STATE_DIR / "lock").unlink()
        _STATE_DIR.rmdir()


def clean_leftovers() -> list[str]:
    """Undoes what a node that was never stopped (its test run killed) left on the host, from the
    snapshot it recorded before it started. Holds the machine lock while it does."""
    state = _STATE_DIR / "state.json"
    if not state.is_file():
        return []
    lock = _acquire_machine_lock()
    try:
        data = json.loads(state.read_text())
        before = host.HostSnapshot.from_json(data["before"])
        workdir = Path(data["workdir"])
        report = host.restore(
            before, workdir=workdir, markers=[data["containerd_socket"]], bridge=BRIDGE
        )
        shutil.rmtree(workdir, ignore_errors=True)
        return report
    finally:
        _release(lock)


# -- configuration -----------------------------------------------------------------------------


def _kubeconfig(cluster_ca: bytes, server: str, user: str, pair: pki.KeyPair) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "node",
                    "cluster": {
                        "server": server,
                        "certificate-authority-data": base64.b64encode(cluster_ca).decode(),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": base64.b64encode(pair.cert_pem).decode(),
                        "client-key-data": base64.b64encode(pair.key_pem).decode(),
                    },
                }
            ],
            "contexts": [{"name": "node", "context": {"cluster": "node", "user": user}}],
            "current-context": "node",
        }
    )


def _containerd_config(root: Path, socket: Path, cni_conf_dir: Path) -> str:
    """containerd 1.6's config (version 2): its own folders and sockets, the CRI plugin with the
    locally built pause image, runc with cgroupfs, the bridge plugin's conf dir, and
    restrict_oom_score_adj (machines without CAP_SYS_RESOURCE cannot lower a sandbox's OOM score,
    and every sandbox failed with "can't get final child's PID from pipe" without it)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"

[{cri}]
  sandbox_image = "{images.pause_image_name()}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin:/bin") or "runc"}"
  Root = "{root / "runc"}"
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{host.CNI_PLUGIN_DIR}"
  conf_dir = "{cni_conf_dir}"
  max_conf_num = 1
"""


def _cni_conflist(ipam_dir: Path) -> str:
    """The pod network: one bridge on this host, addresses from host-local, no masquerading
    (pods talk to this host only; GUARD_TABLE drops anything they would send further)."""
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "kcp-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR, "gateway": HOST_IP}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(ipam_dir),
                    },
                }
            ],
        },
        indent=1,
    )


def _guard_ruleset() -> str:
    return f"""table inet {GUARD_TABLE} {{
  chain forward {{
    type filter hook forward priority filter - 10; policy accept;
    iifname "{BRIDGE}" oifname != "{BRIDGE}" counter drop
    oifname "{BRIDGE}" iifname != "{BRIDGE}" counter drop
  }}
}}
"""


def _kubelet_config(node_dir: Path, socket: Path, ports: Mapping[str, int]) -> dict[str, Any]:
    pki_dir = node_dir / "pki"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": HOST_IP,
        "port": ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports["kubelet-healthz"],
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki_dir / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(pki_dir / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki_dir / "kubelet-serving.key"),
        "containerRuntimeEndpoint": f"unix://{socket}",
        "cgroupDriver": "cgroupfs",
        # Hosts with cgroup v1 (these machines): the kubelet refuses it unless told.
        "failCgroupV1": False,
        "failSwapOn": False,
        # No cluster DNS and no host resolver for pods: a pod asks nothing outside this host.
        "resolvConf": "",
        "podLogsDir": str(node_dir / "pod-logs"),
        "volumePluginDir": str(node_dir / "volume-plugins"),
        "oomScoreAdj": 0,
        # No registry: images are imported, and must never be collected or evicted for a disk
        # that is merely fuller than a real node's thresholds.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": False,
        "maxPods": 30,
        "shutdownGracePeriod": "0s",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }


def _kube_proxy_config(kubeconfig: Path, ports: Mapping[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_CIDR,
        "healthzBindAddress": f"127.0.0.1:{ports['proxy-healthz']}",
        "metricsBindAddress": f"127.0.0.1:{ports['proxy-metrics']}",
        "nodePortAddresses": [f"{HOST_IP}/32"],
        "oomScoreAdj": 0,
        # Leave the host's conntrack settings as they are.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
            "udpTimeout": "0s",
            "udpStreamTimeout": "0s",
        },
    }


def _node_certificates(ca: pki.KeyPair, pki_dir: Path) -> dict[str, pki.KeyPair]:
    pki_dir.mkdir(parents=True, exist_ok=True)
    (pki_dir / "ca.crt").write_bytes(ca.cert_pem)
    pairs = {
        "kubelet": pki.issue(
            ca,
            common_name=f"system:node:{NODE_NAME}",
            organizations=("system:nodes",),
            client=True,
        ),
        "kubelet-serving": pki.issue(ca, common_name=NODE_NAME, server_hosts=(HOST_IP, NODE_NAME)),
        "kube-controller-manager": pki.issue(
            ca, common_name="system:kube-controller-manager", client=True
        ),
        "kube-scheduler": pki.issue(ca, common_name="system:kube-scheduler", client=True),
        "kube-proxy": pki.issue(ca, common_name="system:kube-proxy", client=True),
        # The API server's identity towards kubelets (logs, exec, port-forward).
        "apiserver-kubelet-client": pki.issue(
            ca,
            common_name="kube-apiserver-kubelet-client",
            organizations=("system:masters",),
            client=True,
        ),
    }
    for name, pair in pairs.items():
        pair.write(pki_dir / f"{name}.crt", pki_dir / f"{name}.key")
    return pairs


# -- start -------------------------------------------------------------------------------------


def _spawn(node: NodeCluster, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    proc = clusters._spawn(argv, node.log_path(name))
    node._processes[name] = proc
    return proc


def _check_alive(node: NodeCluster) -> None:
    for name, proc in node._processes.items():
        if proc.poll() is not None:
            raise NodeError(f"{name} exited with {proc.returncode}:\n{node.log_tail(name)}")


def _wait(node: NodeCluster, what: str, probe: Any, timeout: float = _STARTUP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        _check_alive(node)
        try:
            if probe():
                return
        except Exception as exc:  # any failure is "not yet"; the last one is shown
            last = exc
        time.sleep(0.2)
    raise NodeError(f"{what} not within {timeout}s (last: {last!r})")


def _node_ready(core: client.CoreV1Api) -> bool:
    node = core.read_node(NODE_NAME)
    conditions = (node.status and node.status.conditions) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def start_node_cluster(
    name: str, binaries: NodeBinaries | None = None, *, workdir: Path | None = None
) -> NodeCluster:
    """Starts a cluster with one real node and returns once the node is Ready and pods can get
    their ServiceAccount tokens (kube-root-ca.crt published). Raises NodeUnavailable where the
    machine cannot run a node."""
    reason = host.unavailable_reason()
    if reason:
        raise NodeUnavailable(reason)
    for line in clean_leftovers():
        print(f"devenv.node: cleaned after an earlier node: {line}", flush=True)
    binaries = binaries or find_node_binaries()
    lock = _acquire_machine_lock()
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"{host.WORKDIR_PREFIX}{name}-"))
    node_dir = workdir / "node"
    node_dir.mkdir(parents=True, exist_ok=True)
    socket = node_dir / "containerd" / "containerd.sock"
    try:
        before = host.snapshot()
    except BaseException:
        _release(lock)
        raise
    (_STATE_DIR / "state.json").write_text(
        json.dumps(
            {
                "workdir": str(workdir),
                "containerd_socket": str(socket),
                "before": before.to_json(),
            }
        )
    )
    started = time.monotonic()
    timings: dict[str, float] = {}
    ca = pki.new_ca(f"{name}-ca")
    try:
        _host_network()
        pairs = _node_certificates(ca, node_dir / "pki")
        cluster = _start_cluster(name, binaries, workdir, ca, node_dir / "pki")
    except BaseException:
        with contextlib.suppress(Exception):
            host.restore(before, workdir=workdir, markers=[str(socket)], bridge=BRIDGE)
        _release(lock)
        if not os.environ.get("KEEP_CLUSTER_WORKDIRS"):
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    timings["apiserver_ready_s"] = time.monotonic() - started
    node = NodeCluster(
        cluster=cluster,
        workdir=workdir,
        containerd_socket=socket,
        timings=timings,
        _before=before,
        _lock=lock,
    )
    try:
        _start_node(node, binaries, ca, pairs, started)
    except BaseException:
        node.stop()
        raise
    _live_nodes.append(node)
    return node


def _host_network() -> None:
    """The bridge first: the API server and the kubelet bind to its address before any pod
    exists (the bridge plugin then finds it and keeps it); then the guard table."""
    ip = shutil.which("ip", path="/usr/sbin:/usr/bin:/sbin:/bin") or "ip"
    for argv in (
        [ip, "link", "add", BRIDGE, "type", "bridge"],
        [ip, "addr", "add", f"{HOST_IP}/16", "dev", BRIDGE],
        [ip, "link", "set", BRIDGE, "up"],
    ):
        host._run(argv)
    nft = subprocess.run(
        ["nft", "-f", "-"], input=_guard_ruleset(), capture_output=True, text=True, check=False
    )
    if nft.returncode != 0:
        raise NodeError(f"nft refused the node's guard table: {nft.stderr.strip()}")


def _start_cluster(
    name: str, binaries: NodeBinaries, workdir: Path, ca: pki.KeyPair, pki_dir: Path
) -> clusters.TestCluster:
    return clusters.start_cluster(
        name,
        binaries.cluster,
        workdir=workdir,
        ca=ca,
        address=HOST_IP,
        server_hosts=(
            KUBERNETES_SERVICE_IP,
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc.cluster.local",
        ),
        apiserver_flags={
            # The kubernetes Service's endpoints are kept (pods use it), ServiceAccount admission
            # mounts their tokens, kubelets are authorised as nodes, and reached back.
            "--endpoint-reconciler-type": None,
            "--disable-admission-plugins": None,
            "--enable-admission-plugins": "NodeRestriction",
            "--authorization-mode": "Node,RBAC",
            "--kubelet-client-certificate": str(pki_dir / "apiserver-kubelet-client.crt"),
            "--kubelet-client-key": str(pki_dir / "apiserver-kubelet-client.key"),
            "--kubelet-certificate-authority": str(pki_dir / "ca.crt"),
            "--kubelet-preferred-address-types": "InternalIP",
        },
    )


def _start_node(
    node: NodeCluster,
    binaries: NodeBinaries,
    ca: pki.KeyPair,
    pairs: Mapping[str, pki.KeyPair],
    started: float,
) -> None:
    cluster = node.cluster
    timings = node.timings
    node_dir = node.workdir / "node"
    pki_dir = node_dir / "pki"
    socket = node.containerd_socket
    server = cluster.server
    ports = {
        name: clusters.free_port()
        for name in (
            "kubelet",
            "kubelet-healthz",
            "proxy-healthz",
            "proxy-metrics",
            "controller-manager",
            "scheduler",
        )
    }
    kubeconfigs = {}
    for user in ("kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy"):
        path = node_dir / f"{user}.kubeconfig"
        path.write_text(_kubeconfig(ca.cert_pem, server, user, pairs[user]))
        path.chmod(0o600)
        kubeconfigs[user] = path

    # containerd, and the controllers meanwhile.
    (node_dir / "containerd").mkdir(exist_ok=True)
    cni_conf_dir = node_dir / "cni" / "net.d"
    cni_conf_dir.mkdir(parents=True)
    (cni_conf_dir / "10-kcp-node.conflist").write_text(_cni_conflist(node_dir / "cni" / "ipam"))
    containerd_toml = node_dir / "containerd.toml"
    containerd_toml.write_text(_containerd_config(node_dir / "containerd", socket, cni_conf_dir))
    _spawn(node, "containerd", ["containerd", "--config", str(containerd_toml)])
    _spawn(
        node,
        "kube-controller-manager",
        [
            str(binaries["kube-controller-manager"]),
            f"--kubeconfig={kubeconfigs['kube-controller-manager']}",
            f"--authentication-kubeconfig={kubeconfigs['kube-controller-manager']}",
            f"--authorization-kubeconfig={kubeconfigs['kube-controller-manager']}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['controller-manager']}",
            "--leader-elect=false",
            f"--root-ca-file={pki_dir / 'ca.crt'}",
            f"--service-account-private-key-file={node.workdir / 'pki' / 'sa.key'}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={node.workdir / 'pki' / 'ca.crt'}",
            f"--cluster-signing-key-file={node.workdir / 'pki' / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--profiling=false",
            "--v=0",
        ],
    )
    _spawn(
        node,
        "kube-scheduler",
        [
            str(binaries["kube-scheduler"]),
            f"--kubeconfig={kubeconfigs['kube-scheduler']}",
            f"--authentication-kubeconfig={kubeconfigs['kube-scheduler']}",
            f"--authorization-kubeconfig={kubeconfigs['kube-scheduler']}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['scheduler']}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=0",
        ],
    )
    proxy_config = node_dir / "kube-proxy.yaml"
    proxy_config.write_text(yaml.safe_dump(_kube_proxy_config(kubeconfigs["kube-proxy"], ports)))
    _spawn(node, "kube-proxy", [str(binaries["kube-proxy"]), f"--config={proxy_config}", "--v=0"])

    _wait(
        node,
        "containerd's socket",
        lambda: (
            subprocess.run(
                ["ctr", "--address", str(socket), "version"], capture_output=True, check=False
            ).returncode
            == 0
        ),
    )
    timings["containerd_ready_s"] = time.monotonic() - started
    images.import_archive(socket, images.pause_archive())
    timings["pause_imported_s"] = time.monotonic() - started

    kubelet_config = node_dir / "kubelet.yaml"
    kubelet_config.write_text(yaml.safe_dump(_kubelet_config(node_dir, socket, ports)))
    kubelet_started = time.monotonic()
    _spawn(
        node,
        "kubelet",
        [
            str(binaries["kubelet"]),
            f"--config={kubelet_config}",
            f"--kubeconfig={kubeconfigs['kubelet']}",
            f"--root-dir={node_dir / 'kubelet'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={HOST_IP}",
            "--v=0",
        ],
    )
    core = cluster.core
    _wait(node, f"node {NODE_NAME} Ready", lambda: _node_ready(core))
    timings["kubelet_to_ready_s"] = time.monotonic() - kubelet_started
    timings["node_ready_s"] = time.monotonic() - started
    # The kubelet set its kernel tunables as it started (panic 10 s after any oops, overcommit
    # always): put the host's own values back at once; the kubelet does not look again.
    before = node._before
    assert before is not None

    def tunables_set() -> bool:
        return all(host.read_sysctl(k) == v for k, v in host.KUBELET_TUNABLES.items())

    _wait(node, "the kubelet's kernel tunables", tunables_set, timeout=30.0)
    for key in host.KUBELET_TUNABLES:
        value = before.sysctls.get(key)
        if value is not None and host.read_sysctl(key) != value:
            host.write_sysctl(key, value)
    # Every pod's token volume needs kube-root-ca.crt in its namespace (the controller manager
    # publishes it) and the kubernetes Service's endpoints on the bridge address.
    _wait(
        node,
        "kube-root-ca.crt in default",
        lambda: core.read_namespaced_config_map("kube-root-ca.crt", "default") is not None,
    )
    _wait(node, "the kubernetes Service's endpoints", lambda: _service_endpoints(core))
    timings["usable_s"] = time.monotonic() - started


def _service_endpoints(core: client.CoreV1Api) -> bool:
    endpoints = core.read_namespaced_endpoints("kubernetes", "default")
    return any(
        address.ip == HOST_IP
        for subset in endpoints.subsets or []
        for address in subset.addresses or []
    )


@contextlib.contextmanager
def running_node_cluster(name: str, binaries: NodeBinaries | None = None) -> Iterator[NodeCluster]:
    node = start_node_cluster(name, binaries)
    try:
        yield node
    finally:
        node.stop()


@atexit.register
def _stop_leftovers() -> None:
    # Registered after devenv.clusters' hook, so it runs first (atexit is last in, first out).
    for node in list(_live_nodes):
        with contextlib.suppress(Exception):
            node.stop()
