"""The real Kyma lifecycle-manager (KLM) on local API servers: a KCP, runtimes, a registry.

`devenv/klm/build.sh` builds KLM at its pinned commit (and our OCI registry); this module runs
them the way a landscape does, with only the stand-ins docs/module.md names:

- `prepare_kcp`: KLM's CRDs, the cert-manager and Istio CRDs KLM caches (no controllers behind
  them), the Istio Gateway whose host becomes the runtimes' `KCP_ADDR`, and the Secrets
  cert-manager would issue for the watcher;
- `Registry`: an OCI registry holding a module as modulectl + `ocm transfer` lay it out;
- `Klm`: the manager process, reading modules from the registry;
- `add_runtime`: what the provisioner gives KCP for one runtime (its kubeconfig Secret, the
  watcher's certificate Secret, the KCP Kyma);
- `RolloutStandIn`: only for a runtime without a node: the Deployment status
  kube-controller-manager would write, which KLM reads as the module state. With no kubelet,
  readiness comes from the workload's own health endpoint where one is given (the agent's
  `/readyz`), and is assumed for the rest.
- `serve_watcher_image`: for a runtime with a real node (devenv.node), where the kubelet runs
  KLM's skr-webhook and the controller-manager writes every Deployment's status: an image the
  kubelet pulls from the registry under the watcher's name, since the real runtime-watcher image
  is on a registry this machine cannot reach.
"""

from __future__ import annotations

import base64
import datetime
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devenv import pki
from devenv.clusters import TestCluster, free_port

BUILD = Path(__file__).resolve().parent / "build.sh"
KCP_NAMESPACE = "kcp-system"
KYMA_NAMESPACE = "kyma-system"
ISTIO_NAMESPACE = "istio-system"
OPERATOR = ("operator.kyma-project.io", "v1beta2")
# KLM reads this Gateway at start (and exits without it); its host is what the runtimes'
# skr-webhook gets as KCP_ADDR.
GATEWAY_NAME = "klm-watcher"
KCP_EVENTS_HOST = "skr-events.kcp.example.test"
KYMA_NAME_LABEL = "operator.kyma-project.io/kyma-name"
RUNTIME_ID_LABEL = "kyma-project.io/runtime-id"
BETA_LABEL = "operator.kyma-project.io/beta"
SKR_DOMAIN_ANNOTATION = "skr-domain"
SKIP_RECONCILIATION_LABEL = "operator.kyma-project.io/skip-reconciliation"
WEBHOOK_DEPLOYMENT = "skr-webhook"
# KLM names skr-webhook's image `<registry>/<name>:<tag>` from its flags; the registry is ours,
# where a kubelet pulls it (containerd speaks plain HTTP to a registry on 127.0.0.1).
WATCHER_IMAGE_NAME = "runtime-watcher"
WATCHER_IMAGE_TAG = "devenv"


class KlmUnavailable(RuntimeError):
    """The KLM source is not on this machine; the message says why (tests skip with it)."""


@dataclass(frozen=True)
class KlmBuild:
    folder: Path
    registry: Path  # our OCI registry's binary, built from this checkout's source

    @property
    def tree(self) -> Path:
        return self.folder / "lifecycle-manager"

    @property
    def manager(self) -> Path:
        return self.tree / "bin" / "manager"

    def kcp_crds(self) -> list[Path]:
        """KLM's own CRDs, and the cert-manager and Istio ones its caches need (the files KLM's
        integration tests install)."""
        tests = self.tree / "config" / "samples" / "tests" / "crds"
        return [
            *sorted((self.tree / "config" / "crd" / "bases").glob("*.yaml")),
            tests / "cert-manager-v1.10.1.crds.yaml",
            tests / "istio-v1.17.1.crds.yaml",
        ]


def find_klm() -> KlmBuild:
    """KLM and the registry, built once into the user cache (the first time ~6 min)."""
    result = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, check=False)
    if result.returncode == 3:
        raise KlmUnavailable(result.stderr.strip().splitlines()[-1])
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    folder, registry = result.stdout.split()
    return KlmBuild(Path(folder), Path(registry))


# -- the registry ------------------------------------------------------------------------------


@dataclass
class Registry:
    """`ocm-registry serve`: in memory, gone with the process."""

    build: KlmBuild
    workdir: Path
    host: str = ""
    _process: subprocess.Popen[str] | None = field(default=None, repr=False)

    def start(self) -> None:
        log = (self.workdir / "ocm-registry.log").open("w")
        self._process = subprocess.Popen(
            [str(self.build.registry), "serve"],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        log.close()
        assert self._process.stdout is not None
        self.host = self._process.stdout.readline().strip()
        if not self.host:
            raise RuntimeError(f"ocm-registry did not start: {self._log_tail()}")

    def push(
        self, *, component: str, version: str, manifest: Path, resource: str = "raw-manifest"
    ) -> None:
        """The component version with `manifest` as its `resource` (KLM renders
        `raw-manifest`)."""
        self._push(
            f"{component}:{version}",
            "push",
            f"--component={component}",
            f"--version={version}",
            f"--manifest={manifest}",
            f"--resource-name={resource}",
        )

    def push_image(self, archive: Path, reference: str) -> None:
        """The one image of an OCI image layout archive as `reference` (REPO:TAG)."""
        self._push(reference, "push-image", f"--archive={archive}", f"--reference={reference}")

    def _push(self, what: str, command: str, *args: str) -> None:
        result = subprocess.run(
            [str(self.build.registry), command, f"--registry={self.host}", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=90,
        )
        if result.returncode != 0:
            raise RuntimeError(f"push of {what} failed: {result.stderr.strip()}")

    def stop(self) -> None:
        if self._process is not None:
            _stop(self._process)
            if self._process.stdout is not None:
                self._process.stdout.close()
            self._process = None

    def _log_tail(self) -> str:
        return (self.workdir / "ocm-registry.log").read_text(errors="replace")[-2000:]


# -- KCP ----------------------------------------------------------------------------------------


def _secret(name: str, namespace: str, data: Mapping[str, bytes], **metadata: Any) -> Any:
    encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
    return {"metadata": {"name": name, "namespace": namespace, **metadata}, "data": encoded}


def _put(create: Callable[[], Any]) -> None:
    try:
        create()
    except ApiException as e:
        if e.status != 409:
            raise


def prepare_kcp(kcp: TestCluster, build: KlmBuild) -> pki.KeyPair:
    """Returns the watcher's root CA, which issues each runtime's watcher certificate."""
    kcp.apply_crds(build.kcp_crds())
    for namespace in (KCP_NAMESPACE, ISTIO_NAMESPACE):
        kcp.create_namespace(namespace)
    gateway = {
        "apiVersion": "networking.istio.io/v1beta1",
        "kind": "Gateway",
        "metadata": {"name": GATEWAY_NAME, "namespace": KCP_NAMESPACE},
        "spec": {
            "selector": {"istio": "ingressgateway"},
            "servers": [
                {
                    "hosts": [KCP_EVENTS_HOST],
                    "port": {"name": "https", "number": 443, "protocol": "HTTPS"},
                    "tls": {"mode": "MUTUAL", "credentialName": "klm-istio-gateway"},
                }
            ],
        },
    }
    _put(
        lambda: kcp.custom.create_namespaced_custom_object(
            "networking.istio.io", "v1beta1", KCP_NAMESPACE, "gateways", gateway
        )
    )
    # What cert-manager would issue: the watcher's root CA, and the gateway's copy of it with
    # the time the CA entered the bundle (KLM compares certificates' age with it).
    ca = pki.new_ca("klm-watcher")
    root = {"ca.crt": ca.cert_pem, "tls.crt": ca.cert_pem, "tls.key": ca.key_pem}
    added = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    _put(
        lambda: kcp.core.create_namespaced_secret(
            ISTIO_NAMESPACE, _secret("klm-watcher", ISTIO_NAMESPACE, root)
        )
    )
    gateway_secret = _secret(
        "klm-istio-gateway",
        ISTIO_NAMESPACE,
        root,
        annotations={"caAddedToBundleAt": added.strftime("%Y-%m-%dT%H:%M:%SZ")},
    )
    _put(lambda: kcp.core.create_namespaced_secret(ISTIO_NAMESPACE, gateway_secret))
    return ca


def apply_module(kcp: TestCluster, objects: list[dict[str, Any]]) -> None:
    """The ModuleTemplate and ModuleReleaseMeta as the landscape's pipeline applies them."""
    plurals = {"ModuleTemplate": "moduletemplates", "ModuleReleaseMeta": "modulereleasemetas"}
    for obj in objects:
        namespace = obj["metadata"].get("namespace") or KCP_NAMESPACE
        plural, name = plurals[obj["kind"]], obj["metadata"]["name"]
        try:
            current: dict[str, Any] = kcp.custom.get_namespaced_custom_object(  # type: ignore[assignment]
                *OPERATOR, namespace, plural, name
            )
        except ApiException as e:
            if e.status != 404:
                raise
            kcp.custom.create_namespaced_custom_object(*OPERATOR, namespace, plural, obj)
            continue
        update = {**obj, "metadata": {**obj["metadata"], "resourceVersion": _version(current)}}
        kcp.custom.replace_namespaced_custom_object(*OPERATOR, namespace, plural, name, update)


def _version(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["resourceVersion"])


def add_runtime(
    kcp: TestCluster, skr: TestCluster, watcher_ca: pki.KeyPair, *, kyma: str, runtime_id: str
) -> None:
    """What KEB and the provisioner give KCP for one runtime, and the watcher certificate
    cert-manager would issue for it; then the KCP Kyma (beta: the module is beta)."""
    kubeconfig = _secret(
        f"kubeconfig-{kyma}",
        KCP_NAMESPACE,
        {"config": skr.kubeconfig_text.encode()},
        labels={KYMA_NAME_LABEL: kyma},
    )
    _put(lambda: kcp.core.create_namespaced_secret(KCP_NAMESPACE, kubeconfig))
    ca = watcher_ca
    leaf = pki.issue(ca, common_name=runtime_id, server_hosts=(f"{kyma}.skr.example.test",))
    tls = {"ca.crt": ca.cert_pem, "tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem}
    _put(
        lambda: kcp.core.create_namespaced_secret(
            ISTIO_NAMESPACE, _secret(f"{kyma}-webhook-tls", ISTIO_NAMESPACE, tls)
        )
    )
    body = {
        "apiVersion": "operator.kyma-project.io/v1beta2",
        "kind": "Kyma",
        "metadata": {
            "name": kyma,
            "namespace": KCP_NAMESPACE,
            "labels": {RUNTIME_ID_LABEL: runtime_id, BETA_LABEL: "true"},
            "annotations": {SKR_DOMAIN_ANNOTATION: f"{kyma}.skr.example.test"},
        },
        "spec": {"channel": "regular"},
    }
    kcp.custom.create_namespaced_custom_object(*OPERATOR, KCP_NAMESPACE, "kymas", body)


def leave_runtime(kcp: TestCluster, kyma: str) -> None:
    """KLM stops reconciling the Kyma (its skip label), so a runtime whose API server is gone
    does not keep its workers retrying."""
    with suppress(ApiException):
        kcp.custom.patch_namespaced_custom_object(
            *OPERATOR,
            KCP_NAMESPACE,
            "kymas",
            kyma,
            {"metadata": {"labels": {SKIP_RECONCILIATION_LABEL: "true"}}},
        )


def kcp_kyma(kcp: TestCluster, kyma: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = kcp.custom.get_namespaced_custom_object(  # type: ignore[assignment]
            *OPERATOR, KCP_NAMESPACE, "kymas", kyma
        )
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return found


def module_status(kyma: Mapping[str, Any] | None, module: str) -> dict[str, Any] | None:
    for entry in ((kyma or {}).get("status") or {}).get("modules") or []:
        if entry.get("name") == module:
            return dict(entry)
    return None


# -- KLM ------------------------------------------------------------------------------------------


@dataclass
class Klm:
    """The manager process against one KCP; `start` returns once it runs (it exits on its own
    when the KCP lacks what it needs, and the log says what)."""

    build: KlmBuild
    kcp: TestCluster
    registry: Registry
    workdir: Path
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log(self) -> Path:
        return self.workdir / "lifecycle-manager.log"

    def start(self) -> None:
        tmp = self.workdir / "tmp"  # KLM caches raw manifests under $TMPDIR
        tmp.mkdir(parents=True, exist_ok=True)
        health = free_port()
        argv = [
            str(self.build.manager),
            f"--kubeconfig={self.kcp.kubeconfig_path}",
            f"--oci-registry-host=http://{self.registry.host}",
            f"--skr-watcher-image-registry={self.registry.host}",
            f"--skr-watcher-image-name={WATCHER_IMAGE_NAME}",
            f"--skr-watcher-image-tag={WATCHER_IMAGE_TAG}",
            "--leader-elect=false",
            "--metrics-bind-address=127.0.0.1:0",
            f"--health-probe-bind-address=127.0.0.1:{health}",
            f"--kyma-skr-listener-bind-address=127.0.0.1:{free_port()}",
            # Landscape defaults are minutes; the state of a test must show in seconds.
            *(
                f"--{kind}-requeue-{outcome}-interval=2s"
                for kind in ("kyma", "manifest")
                for outcome in ("success", "error", "warning", "busy")
            ),
            "--failure-base-delay=200ms",
            "--failure-max-delay=2s",
        ]
        env = {**os.environ, "TMPDIR": str(tmp)}
        with self.log.open("wb") as log:
            # A session of its own: a Ctrl-C meant for pytest leaves it to the fixture.
            self._process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self._wait_ready(f"http://127.0.0.1:{health}/readyz")

    def _wait_ready(self, url: str, timeout: float = 90.0) -> None:
        """Until its readiness endpoint answers: it exits at start when the KCP lacks what it
        needs (the Gateway, a CRD it caches), and the log says what."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"lifecycle-manager exited at start:\n{self.log_tail()}")
            with suppress(httpx.TransportError):
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"lifecycle-manager not ready after {timeout}s:\n{self.log_tail()}")

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        if self._process is not None:
            _stop(self._process)
            self._process = None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _stop(process: subprocess.Popen[Any]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


# -- the rollout stand-in -------------------------------------------------------------------


Readiness = Callable[[], bool]


@dataclass
class RolloutStandIn:
    """Writes the status kube-controller-manager would write for the Deployments in the
    runtime's kyma-system, as their pods' readiness says.

    A Deployment named in `readiness` is ready when that check says so (for the agent: its own
    `/readyz` answers 200); the others (KLM's skr-webhook, which has no process here) are taken
    as ready. The conditions follow the Deployment controller: Progressing stays True with
    `NewReplicaSetAvailable` once the rollout completed, Available follows the pods.

    Only for a runtime with no node: where one runs, kube-controller-manager writes the status
    from the kubelet's readiness probes, and a second writer would hide what it says, so `start`
    refuses there.
    """

    skr: TestCluster
    readiness: dict[str, Readiness] = field(default_factory=dict)
    period: float = 0.5
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _completed: set[tuple[str, int]] = field(default_factory=set, repr=False)

    def start(self) -> None:
        nodes = [str(n.metadata.name) for n in self.skr.core.list_node().items if n.metadata]
        if nodes:
            raise RuntimeError(
                f"the runtime has a node ({', '.join(nodes)}): its status is real, no stand-in"
            )
        self._thread = threading.Thread(target=self._run, name="rollout-stand-in", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        apps = client.AppsV1Api(self.skr.api_client)
        while not self._stop.wait(self.period):
            with suppress(ApiException, OSError):
                for deployment in apps.list_namespaced_deployment(KYMA_NAMESPACE).items:
                    self._write(apps, deployment)

    def _write(self, apps: client.AppsV1Api, deployment: Any) -> None:
        name, generation = deployment.metadata.name, deployment.metadata.generation
        check = self.readiness.get(name)
        ready = True if check is None else _safe(check)
        if ready:
            self._completed.add((name, generation))
        completed = (name, generation) in self._completed
        replicas = deployment.spec.replicas or 1
        status = {
            "observedGeneration": generation,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas if ready else 0,
            "availableReplicas": replicas if ready else 0,
            "unavailableReplicas": 0 if ready else replicas,
            "conditions": [
                _condition(
                    "Available",
                    ready,
                    "MinimumReplicasAvailable" if ready else "MinimumReplicasUnavailable",
                ),
                _condition(
                    "Progressing",
                    True,
                    "NewReplicaSetAvailable" if completed else "ReplicaSetUpdated",
                ),
            ],
        }
        current = deployment.status
        if current and current.ready_replicas == status["readyReplicas"] and current.conditions:
            reasons = {c.type: c.reason for c in current.conditions}
            wanted = {c["type"]: c["reason"] for c in status["conditions"]}
            if reasons == wanted and current.observed_generation == generation:
                return
        apps.patch_namespaced_deployment_status(name, KYMA_NAMESPACE, {"status": status})


def _safe(check: Readiness) -> bool:
    try:
        return check()
    except Exception:
        return False


def _condition(kind: str, status: bool, reason: str) -> dict[str, str]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "lastUpdateTime": now,
        "lastTransitionTime": now,
    }


@dataclass
class Landscape:
    kcp: TestCluster
    registry: Registry
    klm: Klm
    watcher_ca: pki.KeyPair

    def add_runtime(self, skr: TestCluster, *, kyma: str, runtime_id: str) -> None:
        add_runtime(self.kcp, skr, self.watcher_ca, kyma=kyma, runtime_id=runtime_id)


def serve_watcher_image(registry: Registry, archive: Path) -> str:
    """`archive` (an OCI image layout of a program that runs until stopped, e.g. devenv.node's
    pause image) pushed as the image KLM names for skr-webhook; returns that name.

    For a runtime with a real node only: skr-webhook's manifest pulls its image `Always`, and KLM
    holds the Kyma's SKRWebhook condition False (so the Kyma not Ready) until the Deployment has
    a ready replica. The stand-in serves no webhook: KLM requeues on its own timer instead of on
    the watcher's events. Without a node nothing pulls it (RolloutStandIn writes the status)."""
    reference = f"{WATCHER_IMAGE_NAME}:{WATCHER_IMAGE_TAG}"
    registry.push_image(archive, reference)
    return f"{registry.host}/{reference}"


@contextmanager
def running(build: KlmBuild, kcp: TestCluster, workdir: Path) -> Iterator[Landscape]:
    """A prepared KCP with the registry and KLM running; both stop on the way out."""
    watcher_ca = prepare_kcp(kcp, build)
    registry = Registry(build, workdir)
    registry.start()
    klm = Klm(build, kcp, registry, workdir)
    try:
        klm.start()
        yield Landscape(kcp, registry, klm, watcher_ca)
    finally:
        klm.stop()
        registry.stop()
