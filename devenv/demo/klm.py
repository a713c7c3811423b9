"""`--klm`: the real lifecycle-manager (KLM) installs the agent module in runtime A.

Around it, what devenv.klm gives a landscape's KCP (the stand-ins docs/module.md names): KLM's
CRDs and the cert-manager and Istio CRDs it caches, the watcher's Istio Gateway (its host is the
runtimes' KCP_ADDR) and the Secrets cert-manager would issue, and an OCI registry holding
`make module`'s output as modulectl and `ocm transfer` lay it out. KLM reads the module from that
registry, creates runtime A's Kyma `kyma-system/default`, and applies the manifest there when the
user lists the module. Without a node in runtime A the agent Deployment's status is written from
agent A's own `/readyz` (devenv.klm.RolloutStandIn), so the module state KLM computes from it says
whether the agent is ready; with `--agent-pod` the node's controller manager writes it, and the
registry holds the manifest's pod variant (make image's image, the broker's node address). KLM
and the registry stop with the demo.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from agent import discovery
from devenv import klm
from devenv import kyma_module as km
from devenv.clusters import TestCluster
from devenv.demo import world
from devenv.demo.world import RuntimeSpec

COMMIT = "c5b83f1"  # kyma-project/lifecycle-manager, pinned in devenv/klm/build.sh
CONFIG = km.load_config()
MODULE = CONFIG.short_name  # compass-agent


def why_not_here() -> str | None:
    """Why --klm cannot run here, or None; builds nothing (the story builds on a cold cache)."""
    result = subprocess.run(
        ["bash", str(klm.BUILD), "--find-source"], capture_output=True, text=True, check=False
    )
    if result.returncode == 0:
        return None
    lines = result.stderr.strip().splitlines() or [f"build.sh exited with {result.returncode}"]
    return f"--klm needs lifecycle-manager's build or its source: {lines[-1].removeprefix('klm: ')}"


@dataclass
class RealLifecycleManager:
    """KLM, the registry and the rollout stand-ins, running against the demo's KCP."""

    build: klm.KlmBuild
    landscape: klm.Landscape
    module_files: Path  # what `make module` writes
    _stack: ExitStack = field(repr=False)
    _stand_ins: list[klm.RolloutStandIn] = field(default_factory=list, repr=False)

    @classmethod
    def start(
        cls,
        kcp: TestCluster,
        helm: Path,
        workdir: Path,
        *,
        manifest: Sequence[Mapping[str, Any]] | None = None,
        watcher_image: Path | None = None,
    ) -> RealLifecycleManager:
        """Builds KLM on a cold cache (minutes), writes `make module`'s output, prepares KCP,
        starts the registry and KLM, and publishes the module there (with `manifest` in the
        place of the raw manifest, where given). On a node, `watcher_image` (an image archive)
        is served as the image of KLM's skr-webhook, which a kubelet pulls and KLM waits for."""
        build = klm.find_klm()
        module_files = workdir / "module"
        km.build(helm, module_files)
        if manifest is not None:
            (module_files / km.MANIFEST_FILE).write_text(km.dump_manifest(manifest))
        stack = ExitStack()
        try:
            landscape = stack.enter_context(klm.running(build, kcp, workdir))
            if watcher_image is not None:
                klm.serve_watcher_image(landscape.registry, watcher_image)
            landscape.registry.push(
                component=CONFIG.name,
                version=CONFIG.version,
                manifest=module_files / km.MANIFEST_FILE,
            )
            klm.apply_module(
                kcp,
                [
                    _load(module_files / f"moduletemplate-{CONFIG.template_name}.yaml"),
                    _load(module_files / "module-release-meta.yaml"),
                ],
            )
        except BaseException:
            stack.close()
            raise
        return cls(build, landscape, module_files, stack)

    @property
    def log(self) -> Path:
        return self.landscape.klm.log

    @property
    def running(self) -> bool:
        return self.landscape.klm.running

    def pids(self) -> dict[str, int]:
        """KLM's and the registry's process IDs (they are devenv.klm's children, started from
        this process), for the demo's list of processes."""
        wanted = {
            str(self.build.manager): "lifecycle-manager",
            str(self.build.registry): "ocm-registry",
        }
        found = {}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            name = wanted.get(argv[0].decode(errors="replace"))
            if name is not None and parent == os.getpid():
                found[name] = int(proc.name)
        return found

    def add_runtime(self, kcp: TestCluster, runtime: TestCluster, spec: RuntimeSpec) -> None:
        """What KEB and the provisioner give KCP for a managed runtime (its kubeconfig Secret,
        the watcher certificate, the Kyma as KLM needs it), with KCP's labels on the Kyma."""
        self.landscape.add_runtime(runtime, kyma=spec.kyma_name, runtime_id=spec.runtime_id)
        kcp.custom.patch_namespaced_custom_object(
            *world.KYMA[:2],
            world.KCP_NAMESPACE,
            world.KYMA[2],
            spec.kyma_name,
            {"metadata": {"labels": spec.kcp_labels()}},
        )

    def leave_alone(self, kcp: TestCluster, spec: RuntimeSpec) -> None:
        """A BYOC runtime's Kyma has no kubeconfig Secret: KLM skips it (its skip label), as it
        cannot reach the cluster."""
        klm.leave_runtime(kcp, spec.kyma_name)

    def watch_rollout(self, runtime: TestCluster, agent_ready: klm.Readiness) -> None:
        """The Deployment status kube-controller-manager would write, the agent's from its
        `/readyz`: KLM reads it as the module state."""
        stand_in = klm.RolloutStandIn(runtime, readiness={CONFIG.manager.name: agent_ready})
        stand_in.start()
        self._stand_ins.append(stand_in)

    def stop(self) -> None:
        for stand_in in self._stand_ins:
            stand_in.stop()
        self._stand_ins.clear()
        self._stack.close()


def _load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = km.yaml.safe_load(path.read_text())
    return loaded


# -- reading what KLM did ------------------------------------------------------------------


def installed(runtime: TestCluster) -> client.V1Deployment | None:
    """The agent's Deployment once KLM applied the manifest (its ServiceAccount with it)."""
    account = world.read_or_none(
        client.CoreV1Api(runtime.api_client).read_namespaced_service_account,
        world.AGENT_SERVICE_ACCOUNT,
        world.RUNTIME_NAMESPACE,
    )
    if account is None:
        return None
    found: client.V1Deployment | None = world.read_or_none(
        client.AppsV1Api(runtime.api_client).read_namespaced_deployment,
        CONFIG.manager.name,
        world.RUNTIME_NAMESPACE,
    )
    return found


def kcp_address(runtime: TestCluster) -> str | None:
    """KCP_ADDR on the skr-webhook Deployment KLM keeps in the runtime, read as the agent
    reads it."""
    webhook = world.read_or_none(
        client.AppsV1Api(runtime.api_client).read_namespaced_deployment,
        klm.WEBHOOK_DEPLOYMENT,
        world.RUNTIME_NAMESPACE,
    )
    if webhook is None:
        return None
    return discovery.kcp_address(runtime.api_client.sanitize_for_serialization(webhook))


def states(kcp: TestCluster, spec: RuntimeSpec) -> tuple[str | None, str | None]:
    """(the module's state, the Kyma's state) in the KCP Kyma's status, as KLM writes them."""
    kyma = klm.kcp_kyma(kcp, spec.kyma_name)
    module = klm.module_status(kyma, MODULE)
    return (
        None if module is None else module.get("state"),
        ((kyma or {}).get("status") or {}).get("state"),
    )


def ready(kcp: TestCluster, spec: RuntimeSpec) -> tuple[str, str] | None:
    module, kyma = states(kcp, spec)
    return (module, kyma) if module == "Ready" and kyma == "Ready" else None


def module_state(kcp: TestCluster, spec: RuntimeSpec, module: str) -> str | None:
    """The state KLM gives `module` in the KCP Kyma's status.modules (KLM lists there what the
    runtime's Kyma lists, and never writes the KCP Kyma's spec)."""
    status = klm.module_status(klm.kcp_kyma(kcp, spec.kyma_name), module)
    return None if status is None else str(status.get("state"))


def marks(deployment: client.V1Deployment) -> tuple[str, str, str]:
    """(KLM's component label, its owner annotation, the field managers) on an object it
    applied."""
    metadata = deployment.metadata or client.V1ObjectMeta()
    labels, annotations = metadata.labels or {}, metadata.annotations or {}
    managers = sorted({str(m.manager) for m in metadata.managed_fields or []})
    return (
        labels.get(km.COMPONENT_LABEL, "-"),
        annotations.get(km.OWNED_BY_ANNOTATION, "-"),
        ", ".join(managers) or "-",
    )
