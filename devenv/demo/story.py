"""The demo's story, one method per step, run in order by `Demo.run()`.

Holds: every step either happens within its timeout or raises `StepFailed` (a child process
dying fails the step at once); `Demo.close()` stops every process the demo started, also after a
failure or Ctrl-C; nothing printed contains a token, a key or a kubeconfig (tokens are named by
length and sha256 prefix).
"""

from __future__ import annotations

import base64
import functools
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from cryptography import x509
from cryptography.x509.oid import NameOID

from devenv import clusters, image, kyma_module, runtime_agent
from devenv.clusters import Binaries, TestCluster
from devenv.demo import agent_pod, observe, world
from devenv.demo import klm as real_klm
from devenv.demo.compass import CompassView, RealDirectorView
from devenv.demo.console import StepFailed, Story, table
from devenv.demo.observe import SimAdmin
from devenv.demo.processes import Child, ChildDied, Processes, wait_for_json_line
from devenv.demo.world import RuntimeSpec
from devenv.node import HOST_IP, NodeCluster, NodeError
from devenv.node import images as node_images
from devenv.real_director import (
    OATHKEEPER_VERSION,
    CompassSourceMissing,
    ConnectorUnavailable,
    RealCompass,
    RealCompassError,
    build_director,
    postgres,
    start_real_compass,
)
from devenv.runtime_agent import RealRuntimeAgent, RuntimeAgentUnavailable
from devenv.runtime_agent_sim import TokenSecret, token_fingerprint

REPO_ROOT = Path(__file__).resolve().parents[2]
MAPPING_CRDS = REPO_ROOT / "charts" / "compass-broker" / "crds"
SIM_CLIENT_ID = "compass-broker-demo"
CLUSTER_NAMES = ("kcp", "runtime-a", "runtime-b")
POD_RUNTIME = "runtime-a"  # the cluster with a real node, with --agent-pod
DEMO_MARKER = "KYMA_COMPASS_PULL_DEMO"  # in every child's environment: the work folder
BACKOFFS_TO_SHOW = 3  # temporary answers agent B must get while Compass is down
REAL_DIRECTOR_COMMIT = "a423d60704"  # kyma-incubator/compass, devenv/real_director/build.sh
REAL_AGENT_COMMIT = "859cac3"  # kyma-project/application-connector-manager
# The real compass-runtime-agent's timers in the demo (the module: 180 s and 15 s). Only one real
# agent can run per machine (its metrics server binds :8080, no setting), so runtime B gets it:
# B is the runtime that connects after the outage, the hand-over the real agent makes slow.
REAL_AGENT_KEY = "B"
REAL_AGENT_SYNC_PERIOD = 10.0
REAL_AGENT_MINIMAL_SYNC = 5.0

# Short timers, so the whole story fits in well under two minutes. Production defaults are in
# docs/broker.md and docs/agent.md.
BROKER_TIMERS = {
    "BROKER_BREAKER_FAILURE_THRESHOLD": "3",
    "BROKER_BREAKER_OPEN_SECONDS": "4",
    "BROKER_RETRY_AFTER_JITTER_SECONDS": "1",
    "BROKER_DIRECTOR_TIMEOUT_SECONDS": "3",
    "BROKER_DIRECTOR_QUEUE_TIMEOUT_SECONDS": "2",
    "BROKER_SWEEP_INTERVAL_SECONDS": "5",
    "BROKER_LEASE_DURATION_SECONDS": "4",
    "BROKER_LEASE_RENEW_SECONDS": "1",
    "BROKER_REPORT_MIN_INTERVAL_SECONDS": "2",
    "BROKER_REPORT_INTERVAL_SECONDS": "4",
}
AGENT_TIMERS = {
    "AGENT_BACKOFF_BASE": "0.5",
    "AGENT_BACKOFF_CAP": "4",
    "AGENT_BROKER_TIMEOUT": "10",
    "AGENT_HANDOVER_GRACE": "15",
    "AGENT_CONNECTION_GRACE": "30",
    "AGENT_REFUSAL_CADENCE": "10",
    "AGENT_RESYNC_PERIOD": "30",
    "AGENT_LEASE_DURATION": "6",
    "AGENT_LEASE_RENEW": "2",
    "AGENT_REPORT_INTERVAL_SECONDS": "4",
    "AGENT_REVOKED_RECHECK_SECONDS": "4",
}


@dataclass(frozen=True)
class Options:
    workdir: Path
    keep: bool = False
    outage: str = "refuse"
    timeout_scale: float = 1.0
    real_director: bool = False  # the real Director behind our gateway instead of the simulator
    real_runtime_agent: bool = False  # Kyma's compass-runtime-agent in runtime B
    # The real Connector, hydrator and Oathkeeper next to the real Director (needs it).
    real_connector: bool = False
    runtime_agent_dir: Path | None = None  # its build (devenv.runtime_agent.build())
    # Runtime A on a real node, its agent a pod of this image's archive (devenv/demo/agent_pod.py).
    agent_image: Path | None = None
    # The real lifecycle-manager installs the module in runtime A (devenv/demo/klm.py).
    klm: bool = False


@dataclass
class Runtime:
    """One runtime of the demo: its API server, its agent and its simulated runtime agent."""

    spec: RuntimeSpec
    cluster: TestCluster
    token_file: Path
    agent: Child | None = None
    agent_port: int = 0
    agent_host: str = "127.0.0.1"  # a pod's own address with --agent-pod
    runtime_agent: Child | None = None
    real_agent: RealRuntimeAgent | None = None  # the real compass-runtime-agent, if it runs here
    compass_runtime_id: str = ""

    @property
    def runtime_agent_name(self) -> str:
        if self.real_agent is not None:
            return f"compass-runtime-agent (real, {REAL_AGENT_COMMIT})"
        return "compass-runtime-agent (simulated)"

    @property
    def kubeconfig(self) -> Path:
        """The agent's access to its API server: a token of the module's ServiceAccount."""
        return self.token_file.with_name(f"{self.token_file.name}.kubeconfig")

    @property
    def agent_url(self) -> str:
        return f"http://{self.agent_host}:{self.agent_port}"


@dataclass
class Summary:
    rows: list[list[str]] = field(default_factory=list)
    calls: dict[str, str] = field(default_factory=dict)


def _child_env(**values: str) -> dict[str, str]:
    """Our environment without settings meant for someone else, plus `values`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BROKER_", "AGENT_", "COMPASS_SIM_")) and k != "KUBECONFIG"
    }
    env.update(values)
    return env


def _marked(workdir: Path, **values: str) -> dict[str, str]:
    """`_child_env` plus a marker naming the demo's work folder, so leftovers can be found."""
    return _child_env(**{DEMO_MARKER: str(workdir)}, **values)


def _short(token: str) -> str:
    return f"{len(token)} chars, sha256:{token_fingerprint(token)}"


class Demo:
    def __init__(self, options: Options, story: Story) -> None:
        self.options = options
        self.story = story
        self.workdir = options.workdir
        self.secrets_dir = self.workdir / "secrets"
        self.secrets_dir.mkdir(parents=True, exist_ok=True)
        self.processes = Processes(self.workdir)
        self.clusters: dict[str, TestCluster] = {}
        self.runtimes: dict[str, Runtime] = {}
        self.specs = {
            "A": RuntimeSpec.new("A", managed=True),
            "B": RuntimeSpec.new("B", managed=False),
        }
        self.sim: CompassView | None = None
        self.sim_urls: dict[str, str] = {}  # director_url, connector_url, token_url, ...
        self.real: RealCompass | None = None  # with --real-director
        self.klm: real_klm.RealLifecycleManager | None = None  # with --klm
        self.broker: Child | None = None
        self.broker_url = ""
        self.node: NodeCluster | None = None  # runtime A's, with --agent-pod
        # Pods reach this host only on the node's bridge: the broker listens there, on a port
        # chosen now, since the agent pod's manifest names it before the broker starts.
        self.broker_host, self.broker_port = (
            (HOST_IP, clusters.free_port()) if options.agent_image else ("127.0.0.1", 0)
        )
        self.manifest: list[dict[str, Any]] = []
        self._tokens_projected_at = 0.0
        self.finished = False  # every step happened

    # -- helpers ---------------------------------------------------------------------------

    def _timeout(self, seconds: float) -> float:
        return seconds * self.options.timeout_scale

    def _guard(self) -> None:
        try:
            self.processes.check_alive()
        except ChildDied as exc:
            raise StepFailed(str(exc)) from exc
        if self.klm is not None and not self.klm.running:
            raise StepFailed("lifecycle-manager exited", logs=[self.klm.log])

    @property
    def kcp(self) -> TestCluster:
        return self.clusters["kcp"]

    @property
    def compass(self) -> CompassView:
        assert self.sim is not None, "Compass is not running"
        return self.sim

    @property
    def compass_name(self) -> str:
        return "gateway" if self.options.real_director else "simulator"

    def _logs(self, *children: Child | None) -> list[Path]:
        paths = [c.log_path for c in children if c is not None]
        if self.node is not None and None in children:  # the agent that is a pod
            paths += agent_pod.log_paths(self.node)
        return paths

    def _is_pod(self, runtime: Runtime) -> bool:
        return self.node is not None and runtime.cluster is self.node.cluster

    # -- the story -------------------------------------------------------------------------

    def run(self) -> Summary:
        binaries = self.find_binaries()
        self.start_clusters(binaries)
        self.render_module(binaries)
        if self.options.klm:
            self.start_lifecycle_manager(binaries)
        self.start_compass()
        self.seed_control_plane()
        self.prepare_runtimes()
        self.start_broker()
        self.start_agents()
        self.enable_module_in_a()
        self.runtime_agent_connects(self.runtimes["A"])
        self.take_compass_down()
        self.enable_module_in_b_while_down()
        self.show_mappings(connected=("A",))
        self.bring_compass_back()
        self.runtime_agent_connects(self.runtimes["B"])
        self.show_mappings(connected=("A", "B"))
        self.revoke_b()
        self.delete_kyma_a()
        summary = self.summarize()
        self.finished = True
        return summary

    def find_binaries(self) -> Binaries:
        self.story.step("Control-plane binaries (kube-apiserver, etcd)")
        try:
            binaries = clusters.find_binaries()
        except clusters.ClusterError as exc:
            raise StepFailed(str(exc)) from exc
        self.story.done(f"found in {binaries.folder}")
        return binaries

    def render_module(self, binaries: Binaries) -> None:
        config = kyma_module.load_config()
        self.story.step(f"The agent's Kyma module {config.name} {config.version} (make module)")
        try:
            self.manifest = kyma_module.render_manifest(binaries.helm, config)
            kyma_module.check_manifest(self.manifest, config)
        except kyma_module.ManifestError as exc:
            raise StepFailed(f"the module manifest is not usable: {exc}") from exc
        kinds = sorted({str(obj["kind"]) for obj in self.manifest})
        self.story.done(
            f"one manifest for every cluster, {len(self.manifest)} objects ({', '.join(kinds)}): "
            "no broker URL, no runtime ID in it"
        )

    def start_lifecycle_manager(self, binaries: Binaries) -> None:
        self.story.step(
            f"The real lifecycle-manager (kyma-project/lifecycle-manager {real_klm.COMMIT}) in "
            "KCP, reading the module from an OCI registry"
        )
        self.story.waiting(
            "devenv/klm/build.sh: the cached build, or a build from the pinned source (the first "
            "one takes minutes); make module's output; KLM's CRDs, the cert-manager and Istio "
            "CRDs it caches, the watcher's Gateway and Secrets in KCP"
        )
        workdir = self.workdir / "klm"
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.klm = real_klm.RealLifecycleManager.start(
                self.kcp,
                binaries.helm,
                workdir,
                # Runtime A's pod runs make image's image and reaches the broker on the node's
                # host address: the component carries that variant of the manifest.
                manifest=self._pod_manifest() if self.options.agent_image else None,
                watcher_image=node_images.pause_archive() if self.options.agent_image else None,
            )
        except real_klm.klm.KlmUnavailable as exc:
            raise StepFailed(f"--klm needs lifecycle-manager's source: {exc}") from exc
        except (RuntimeError, OSError, kyma_module.ManifestError) as exc:
            raise StepFailed(
                f"lifecycle-manager did not start: {str(exc)[:2000]}",
                logs=[workdir / "lifecycle-manager.log", workdir / "ocm-registry.log"],
            ) from exc
        for name, pid in self.klm.pids().items():
            self.processes.note(name, pid)
        config = real_klm.CONFIG
        registry = self.klm.landscape.registry.host
        self.story.detail(
            f"registry  {registry}: component-descriptors/{config.name}:{config.version} "
            "(make module's compass-agent.yaml as its raw-manifest, in modulectl's OCM layout)"
        )
        self.story.detail(
            f"KCP       ModuleTemplate {config.template_name} and ModuleReleaseMeta "
            f"{config.short_name} from make module, unchanged"
        )
        self.story.detail(f"KLM's log {self.klm.log}")
        self.story.done(
            "lifecycle-manager runs; KCP_ADDR for the runtimes is the watcher Gateway's host "
            f"{real_klm.klm.KCP_EVENTS_HOST}:443"
        )

    def start_clusters(self, binaries: Binaries) -> None:
        self.story.step(
            "Three API servers: control plane (KCP), runtime A (managed), runtime B (BYOC)"
        )
        self.story.waiting("starting etcd + kube-apiserver for each, in parallel, and the CRDs")

        def start(name: str) -> None:
            folder = self.workdir / "clusters" / name
            folder.mkdir(parents=True, exist_ok=True)
            if name == POD_RUNTIME and self.options.agent_image is not None:
                self.node = agent_pod.start_node(name, self.options.agent_image)
                cluster = self.node.cluster
            else:
                cluster = clusters.start_cluster(name, binaries, workdir=folder)
            self.clusters[name] = cluster  # recorded at once, so close() stops it whatever happens
            crds = clusters.kyma_crds()
            if name == "kcp":
                crds += sorted(MAPPING_CRDS.glob("*.yaml"))
            cluster.apply_crds(crds)

        try:
            with ThreadPoolExecutor(max_workers=3) as pool:
                list(pool.map(start, CLUSTER_NAMES))
        except (clusters.ClusterError, NodeError) as exc:
            raise StepFailed(f"a cluster did not start: {exc}") from exc
        for name in CLUSTER_NAMES:
            self.story.detail(f"{name:<10} {self.clusters[name].server}")
        if self.node is not None:
            self.story.detail(
                f"{POD_RUNTIME} has a real node (kubelet, containerd, controller manager, "
                f"scheduler, kube-proxy; Ready in {self.node.timings.get('node_ready_s', 0):.1f}s) "
                f"and {image.image_name()} from make image; its folder {self.node.workdir}"
            )
        self.story.wait_for(
            "custom resources served (a fresh API server answers 429 for a few seconds)",
            self._all_served,
            timeout=self._timeout(30),
            logs=[c.workdir / "kube-apiserver.log" for c in self.clusters.values()],
        )
        self.story.done(
            "Kyma, ApplicationConnector, CompassConnection CRDs everywhere; "
            "CompassManagerMapping CRD in KCP"
        )

    def _all_served(self) -> bool:
        return all(
            world.custom_resources_served(cluster, control_plane=name == "kcp")
            for name, cluster in self.clusters.items()
        )

    def start_compass(self) -> None:
        if self.options.real_director:
            self.start_real_director()
        else:
            self.start_simulator()

    def start_simulator(self) -> None:
        self.story.step("Compass simulator (OAuth2 token endpoint, Director, Connector)")
        secret = secrets.token_urlsafe(24)
        # The real compass-runtime-agent also needs the certificate-secured side after Connected.
        module = "devenv.compass_sim"
        if self.options.real_runtime_agent:
            module = "devenv.demo.compass_sim_mtls"
        child = self.processes.start(
            "compass-sim",
            [sys.executable, "-m", module, "--client-id", SIM_CLIENT_ID],
            env=_marked(self.workdir, COMPASS_SIM_CLIENT_SECRET=secret),
        )
        self.story.waiting(f"python -m {module}")
        try:
            self.sim_urls = wait_for_json_line(
                child, lambda e: "admin_url" in e, timeout=self._timeout(20)
            )
        except (ChildDied, TimeoutError) as exc:
            raise StepFailed(
                f"the Compass simulator did not start: {exc}", logs=[child.log_path]
            ) from exc
        self.sim = SimAdmin(self.sim_urls["admin_url"])
        world.write_director_credentials(
            self.secrets_dir / "director-credentials.yaml",
            client_id=SIM_CLIENT_ID,
            secret=secret,
            token_url=self.sim_urls["token_url"],
        )
        self.story.detail(f"Director  {self.sim_urls['director_url']}")
        self.story.detail(f"Connector {self.sim_urls['connector_url']}")
        self.story.detail(
            f"admin     {self.sim_urls['admin_url']}/_sim/ (faults, counters, runtimes)"
        )
        if "certificate_secured_url" in self.sim_urls:
            self.story.detail(
                f"mTLS      {self.sim_urls['certificate_secured_url']} (certificate-secured "
                "Connector and Director, for the real compass-runtime-agent)"
            )
        self.story.done(
            "Compass is up; the broker gets OAuth client credentials in "
            "compass-manager's file format"
        )

    def start_real_director(self) -> None:
        if self.options.real_connector:
            self.story.step(
                f"The real Compass Director, Connector, hydrator and Oathkeeper "
                f"(kyma-incubator/compass {REAL_DIRECTOR_COMMIT}, ory/oathkeeper "
                f"{OATHKEEPER_VERSION}), our gateway as Hydra for the broker"
            )
        else:
            self.story.step(
                f"The real Compass Director (kyma-incubator/compass {REAL_DIRECTOR_COMMIT}) behind "
                "our gateway (OAuth2 token endpoint, JWT, Connector)"
            )
        self.story.waiting(
            "devenv/real_director/build.sh: the cached build, or a build from the pinned source "
            "(the first one takes minutes)"
        )
        try:
            folder = build_director()
        except CompassSourceMissing as exc:
            raise StepFailed(f"--real-director needs the pinned Compass source: {exc}") from exc
        except RealCompassError as exc:
            raise StepFailed(f"the real Director could not be built: {exc}") from exc
        self.story.waiting(
            "PostgreSQL with Director's schema, Director (its ConfigMap and Secrets in KCP, "
            "namespace of their own), the gateway"
        )
        if self.options.real_connector:
            self.story.waiting(
                "devenv/real_director/build-connector.sh: Connector and hydrator from the same "
                "tree, Oathkeeper from the Go module proxy (cached; the first build takes minutes)"
            )
        try:
            stack = start_real_compass(
                self.workdir / "real-director",
                cluster=self.kcp,
                director_folder=folder,
                real_connector=self.options.real_connector,
            )
        except (RealCompassError, ConnectorUnavailable) as exc:
            raise StepFailed(f"the real Director did not start: {exc}") from exc
        self.real = stack
        self.sim = RealDirectorView(stack)
        if stack.real_connector is not None:
            # Its certificate-secured side (our front in Istio's place) serves from the start.
            self.sim_urls["certificate_secured_url"] = stack.real_connector.certificate_secured_url
        elif self.options.real_runtime_agent:
            # What the real compass-runtime-agent syncs with after Connected.
            self.sim_urls["certificate_secured_url"] = stack.start_certificate_secured()
        for name, pid in stack.pids().items():
            self.processes.note(f"real-director-{name}", pid)
        self.sim_urls.update(
            director_url=stack.director_url,
            connector_url=stack.connector_url,
            token_url=stack.token_url,
        )
        for spec in self.specs.values():
            stack.add_global_account(spec.global_account)
            stack.add_subaccount(spec.subaccount, parent=spec.global_account, region="westeurope")
            self.story.detail(
                f"{spec.title}: global account {spec.global_account[:8]}… and subaccount "
                f"{spec.subaccount[:8]}… written as Director's tenants (as the tenant fetcher "
                "syncs them)"
            )
        stack.write_credentials_file(self.secrets_dir / "director-credentials.yaml")
        self.story.detail(f"gateway   {stack.gateway_url} (admin: /_gateway/calls)")
        self.story.detail(f"Director  {stack.director_url}")
        if stack.real_connector is not None:
            self.story.detail(
                f"Connector {stack.connector_url} (Oathkeeper with Compass's rules, the hydrator "
                "spends the token at Director, then the Connector: all real)"
            )
            self.story.detail(
                f"mTLS      {self.sim_urls['certificate_secured_url']} (our front in Istio's "
                "place sets Certificate-Data; Oathkeeper, hydrator, then Connector or Director: "
                "a client certificate's CN names the runtime's SystemAuth)"
            )
        else:
            self.story.detail(
                f"Connector {stack.connector_url} (one-time tokens checked and spent in "
                "Director's database, as Compass's hydrator does through Director)"
            )
            if "certificate_secured_url" in self.sim_urls:
                self.story.detail(
                    f"mTLS      {self.sim_urls['certificate_secured_url']} (certificate-secured "
                    "Connector and Director: a client certificate's CN names the runtime's "
                    "SystemAuth)"
                )
        self.story.detail(
            f"started in {stack.timings.get('total', 0.0):.1f}s; Director's log "
            f"{stack.director_log}"
        )
        self.story.done(
            "Compass is up; the broker gets OAuth client credentials in compass-manager's file "
            "format, from the gateway's token endpoint"
        )

    def seed_control_plane(self) -> None:
        self.story.step(
            "KCP: Kyma CRs and runtime kubeconfig Secrets (managed runtimes only), as the control "
            "plane has them"
        )
        for key, name in (("A", "runtime-a"), ("B", "runtime-b")):
            spec, cluster = self.specs[key], self.clusters[name]
            if spec.managed and self.klm is not None:
                self.klm.add_runtime(self.kcp, cluster, spec)
            else:
                world.seed_control_plane(self.kcp, spec, cluster)
                if self.klm is not None:
                    self.klm.leave_alone(self.kcp, spec)
            self.story.detail(
                f"{spec.title}: Kyma {world.KCP_NAMESPACE}/{spec.kyma_name}, shoot {spec.shoot}, "
                f"global account {spec.global_account[:8]}…, plan azure"
            )
            indent = " " * len(spec.title)
            if spec.managed:
                secret = f"{world.KCP_NAMESPACE}/kubeconfig-{spec.kyma_name}"
                self.story.detail(f"{indent}  Secret {secret} (key config)")
                if self.klm is not None:
                    self.story.detail(
                        f"{indent}  for lifecycle-manager: the Kyma beta and with its skr-domain; "
                        f"Secret istio-system/{spec.kyma_name}-webhook-tls as cert-manager would "
                        "issue it"
                    )
            else:
                self.story.detail(
                    f"{indent}  no kubeconfig Secret: KCP cannot reach this cluster; its "
                    f"ServiceAccount issuer {cluster.issuer} publishes its keys (OIDC discovery)"
                )
                if self.klm is not None:
                    self.story.detail(
                        f"{indent}  label {real_klm.klm.SKIP_RECONCILIATION_LABEL}=true: "
                        "lifecycle-manager cannot reach it either"
                    )
        self.story.done("no module enabled yet: nothing talks to Compass")

    def prepare_runtimes(self) -> None:
        self.story.step("Runtimes: the agent arrives as the compass-agent Kyma module")
        for key, name in (("A", "runtime-a"), ("B", "runtime-b")):
            spec, cluster = self.specs[key], self.clusters[name]
            by_klm = spec.managed and self.klm is not None
            world.prepare_runtime(cluster, spec, real_klm=by_klm)
            runtime = Runtime(spec, cluster, self.secrets_dir / f"sa-token-{name}")
            manifest = self._pod_manifest() if self._is_pod(runtime) else self.manifest
            if by_klm:
                self._install_by_klm(runtime)
            else:
                for line in world.install_agent_module(self.kcp, cluster, spec, manifest):
                    self.story.detail(f"{spec.title}: {line}")
            self.runtimes[key] = runtime
            if self._is_pod(runtime):
                self.story.detail(
                    f"{spec.title}: the Deployment runs as a pod (image {image.image_name()}, "
                    f"broker {self._pod_broker_url}); the kubelet projects its token"
                )
                continue
            world.agent_kubeconfig(cluster, runtime.kubeconfig)
            token = world.project_token(cluster, runtime.token_file)
            where = (
                "runtime ID from the Kyma CR kyma-system/default, labelled by KLM"
                if spec.managed
                else "no Kyma CR (bring your own cluster): runtime ID from the module's ConfigMap"
            )
            self.story.detail(f"{spec.title}: {where}")
            self.story.detail(
                f"{' ' * len(spec.title)}  token of kyma-system/compass-agent, audience "
                f"{world.AUDIENCE}: {_short(token)}"
            )
        self._tokens_projected_at = time.monotonic()
        processes = "agent B runs" if self.node is not None else "no kubelet here: the agents run"
        self.story.done(
            "the module's objects are in both runtimes; tokens written to files, as the kubelet "
            f"projects them ({processes} as a process, with the module's ServiceAccount and the "
            "Deployment's environment)"
        )

    @property
    def _pod_broker_url(self) -> str:
        return f"http://{self.broker_host}:{self.broker_port}"

    def _pod_manifest(self) -> list[dict[str, Any]]:
        """The module's manifest as runtime A's pod runs it here (devenv/demo/agent_pod.py)."""
        env = {"AGENT_BROKER_URL": self._pod_broker_url, **AGENT_TIMERS}
        return agent_pod.pod_manifest(self.manifest, env=env)

    def _install_by_klm(self, runtime: Runtime) -> None:
        """The user lists the module in the Kyma KLM made; KLM installs it from the registry."""
        assert self.klm is not None
        cluster, title = runtime.cluster, runtime.spec.title
        logs = [self.klm.log]
        self.story.wait_for(
            f"lifecycle-manager creates Kyma {world.RUNTIME_NAMESPACE}/default in {title}",
            lambda: world.runtime_kyma(cluster),
            timeout=self._timeout(90),
            guard=self._guard,
            logs=logs,
        )
        world.add_module(cluster.custom, world.RUNTIME_NAMESPACE, "default", world.AGENT_MODULE)
        self.story.detail(
            f"{title}: {world.AGENT_MODULE} added to spec.modules of Kyma "
            f"{world.RUNTIME_NAMESPACE}/default (lifecycle-manager created it, with the runtime "
            "ID label)"
        )
        deployment = self.story.wait_for(
            "lifecycle-manager reads the module's OCM component from the registry",
            lambda: real_klm.installed(cluster),
            timeout=self._timeout(90),
            guard=self._guard,
            logs=logs,
        )
        component, owner, managers = real_klm.marks(deployment)
        self.story.detail(
            f"{title}: lifecycle-manager applies the release manifest (field manager "
            f"{managers}): Deployment {world.RUNTIME_NAMESPACE}/"
            f"{real_klm.CONFIG.manager.name} with {kyma_module.COMPONENT_LABEL}={component}, "
            f"{kyma_module.OWNED_BY_ANNOTATION}={owner}"
        )
        address = self.story.wait_for(
            "and its skr-webhook Deployment with KCP_ADDR",
            lambda: real_klm.kcp_address(cluster),
            timeout=self._timeout(30),
            guard=self._guard,
            logs=logs,
        )
        self.story.detail(
            f"{title}: skr-webhook KCP_ADDR={address}: a landscape's agent makes its broker URL "
            "of it (https only); the demo's broker is plain http on this host, so AGENT_BROKER_URL "
            "names it"
        )
        if self._is_pod(runtime):
            self.story.detail(
                f"{title}: the kubelet runs its pod; kube-controller-manager writes the "
                "Deployment's status, and lifecycle-manager reads it as the module state"
            )
            return
        self.story.detail(
            f"{title}: no kubelet: the Deployment's status is written from agent A's /readyz, "
            "and lifecycle-manager reads it as the module state"
        )
        self.klm.watch_rollout(cluster, functools.partial(_agent_ready, runtime))

    def start_broker(self) -> None:
        self.story.step("Broker in the control plane (python -m control_plane_broker)")
        assert self.sim_urls
        env = _marked(
            self.workdir,
            KUBECONFIG=str(self.kcp.kubeconfig_path),
            BROKER_DIRECTOR_URL=self.sim_urls["director_url"],
            BROKER_DIRECTOR_CREDENTIALS_FILE=str(self.secrets_dir / "director-credentials.yaml"),
            BROKER_KCP_NAMESPACE=world.KCP_NAMESPACE,
            BROKER_LEASE_NAMESPACE=world.KCP_NAMESPACE,
            BROKER_HOST=self.broker_host,
            BROKER_PORT=str(self.broker_port),
            BROKER_IDENTITY_MODE="tokenreview",
            BROKER_AUDIENCE=world.AUDIENCE,
            BROKER_ALLOWED_SERVICE_ACCOUNTS=f"{world.RUNTIME_NAMESPACE}/{world.AGENT_SERVICE_ACCOUNT}",
            # Runtime B's issuer is its API server, whose certificate is under that cluster's CA.
            BROKER_ISSUER_CA_FILE=str(self.clusters["runtime-b"].ca_file),
            **BROKER_TIMERS,
        )
        child = self.processes.start(
            "broker", [sys.executable, "-m", "control_plane_broker"], env=env
        )
        self.broker = child
        self.story.waiting("waiting for it to listen and to sync its Kyma cache")
        try:
            entry = wait_for_json_line(
                child, lambda e: e.get("msg") == "listening", timeout=self._timeout(30)
            )
        except (ChildDied, TimeoutError) as exc:
            raise StepFailed(f"the broker did not start: {exc}", logs=[child.log_path]) from exc
        self.broker_url = f"http://{self.broker_host}:{entry['port']}"
        self.story.wait_for(
            "broker /readyz",
            lambda: _http_ok(f"{self.broker_url}/readyz"),
            timeout=self._timeout(30),
            guard=self._guard,
            logs=[child.log_path],
        )
        self.story.done(
            f"{self.broker_url}: identity by TokenReview on the asking runtime's API server "
            "(BYOC without a kubeconfig Secret: by its approved issuer's keys), breaker opens "
            f"after {BROKER_TIMERS['BROKER_BREAKER_FAILURE_THRESHOLD']} failures "
            f"for {BROKER_TIMERS['BROKER_BREAKER_OPEN_SECONDS']} s"
        )

    def start_agents(self) -> None:
        self.story.step(
            "One agent per runtime "
            + ("(A a pod, B python -m agent)" if self.node is not None else "(python -m agent)")
            + " and a compass-runtime-agent"
            + (" (real in runtime B)" if self.options.real_runtime_agent else " (simulated)")
        )
        for runtime in self.runtimes.values():
            if not self._is_pod(runtime):
                self._start_agent(runtime)
            if self.options.real_runtime_agent and runtime.spec.key == REAL_AGENT_KEY:
                self._start_real_runtime_agent(runtime)
            else:
                self._start_runtime_agent(runtime)
        for runtime in self.runtimes.values():
            if self._is_pod(runtime):
                runtime.agent_host = self.story.wait_for(
                    f"agent {runtime.spec.key}'s pod Ready (the kubelet's readiness probe)",
                    functools.partial(agent_pod.ready_pod_ip, runtime.cluster),
                    timeout=self._timeout(60),
                    guard=self._guard,
                    logs=self._logs(None),
                )
                runtime.agent_port = agent_pod.HEALTH_PORT
                continue
            assert runtime.agent is not None
            try:
                entry = wait_for_json_line(
                    runtime.agent,
                    lambda e: e.get("msg") == "agent started",
                    timeout=self._timeout(30),
                )
            except (ChildDied, TimeoutError) as exc:
                raise StepFailed(
                    f"agent {runtime.spec.key} did not start: {exc}", logs=[runtime.agent.log_path]
                ) from exc
            runtime.agent_port = int(entry["health_port"])
        for runtime in self.runtimes.values():
            url = f"{runtime.agent_url}/readyz"
            self.story.wait_for(
                f"agent {runtime.spec.key} /readyz (its watches have listed once)",
                _answers_ok(url),
                timeout=self._timeout(30),
                guard=self._guard,
                logs=self._logs(runtime.agent),
            )
        for runtime in self.runtimes.values():
            source = (
                "from the Kyma CR label" if runtime.spec.managed else "from the module's ConfigMap"
            )
            self.story.detail(
                f"agent {runtime.spec.key}: {runtime.agent_url}/metrics, runtime ID "
                f"{runtime.spec.runtime_id} {source}"
            )
            if runtime.real_agent is not None:
                self.story.detail(
                    f"runtime {runtime.spec.key}: {runtime.runtime_agent_name} as ServiceAccount "
                    f"{runtime_agent.AGENT_NAMESPACE}/{runtime_agent.SERVICE_ACCOUNT} (its own "
                    f"RBAC), sync period {REAL_AGENT_SYNC_PERIOD:g}s, minimal sync "
                    f"{REAL_AGENT_MINIMAL_SYNC:g}s (the module: 180s, 15s)"
                )
                self.story.detail(
                    f"           only one real agent per machine (its metrics server binds "
                    f":{runtime_agent.METRICS_PORT}): the other runtime keeps the simulated one"
                )
        if self.klm is not None:
            self._module_ready_in_kcp(self.klm, self.runtimes["A"])
        self.story.done("agents ready and idle: the module is not enabled anywhere yet")

    def _module_ready_in_kcp(self, klm: real_klm.RealLifecycleManager, runtime: Runtime) -> None:
        spec = runtime.spec
        source = (
            "the Deployment status kube-controller-manager writes"
            if self._is_pod(runtime)
            else "agent A's readiness"
        )
        module, kyma = self.story.wait_for(
            f"KCP: the Kyma of {spec.title} says module {real_klm.MODULE} Ready (from {source}) "
            "and Kyma Ready",
            functools.partial(real_klm.ready, self.kcp, spec),
            timeout=self._timeout(90),
            guard=self._guard,
            logs=[klm.log],
        )
        self.story.detail(
            f"Kyma {world.KCP_NAMESPACE}/{spec.kyma_name}: module {real_klm.MODULE} {module}, "
            f"Kyma {kyma} (lifecycle-manager's status)"
        )

    def _start_agent(self, runtime: Runtime) -> None:
        spec = runtime.spec
        # The Deployment's own environment, with only what a pod would have differently: the
        # kubeconfig instead of the in-cluster token, local ports and files, short timers, and
        # the broker URL (the demo's broker is plain http on localhost, which only an explicit
        # AGENT_BROKER_URL may name).
        local = {
            "AGENT_BROKER_URL": self.broker_url,
            "AGENT_KUBECONFIG": str(runtime.kubeconfig),
            "AGENT_SA_TOKEN_FILE": str(runtime.token_file),
            "AGENT_AUDIENCE": world.AUDIENCE,
            "AGENT_NAMESPACE": world.RUNTIME_NAMESPACE,
            "AGENT_HEALTH_ADDRESS": "127.0.0.1:0",
            "AGENT_IDENTITY": f"compass-agent-{spec.key.lower()}",
            **AGENT_TIMERS,
        }
        if self.options.real_runtime_agent and spec.key == REAL_AGENT_KEY:
            # The hand-over waits out the real agent's minimal sync time (plus a second).
            local["AGENT_RUNTIME_AGENT_MIN_SYNC"] = f"{REAL_AGENT_MINIMAL_SYNC + 1:g}"
        env = _marked(self.workdir, **{**world.agent_environment(self.manifest), **local})
        runtime.agent = self.processes.start(
            f"agent-{spec.key.lower()}", [sys.executable, "-m", "agent"], env=env
        )

    def _start_runtime_agent(self, runtime: Runtime) -> None:
        runtime.runtime_agent = self.processes.start(
            f"runtime-agent-{runtime.spec.key.lower()}",
            [
                sys.executable,
                "-m",
                "devenv.runtime_agent_sim",
                "--kubeconfig",
                str(runtime.cluster.kubeconfig_path),
                "--interval",
                "0.3",
            ],
            env=_marked(self.workdir),
        )

    def _start_real_runtime_agent(self, runtime: Runtime) -> None:
        folder = self.options.runtime_agent_dir
        if folder is None:
            raise StepFailed("--real-runtime-agent: the agent's build folder is not known")
        name = f"runtime-agent-{runtime.spec.key.lower()}"
        real = RealRuntimeAgent(
            runtime.cluster,
            folder,
            self.workdir / name,
            sync_period=REAL_AGENT_SYNC_PERIOD,
            minimal_sync=REAL_AGENT_MINIMAL_SYNC,
            lock_timeout=self._timeout(30),
        )
        try:
            real.start()
        except RuntimeAgentUnavailable as exc:
            raise StepFailed(f"the real compass-runtime-agent cannot run: {exc.reason}") from exc
        runtime.real_agent = real
        assert real.process is not None
        runtime.runtime_agent = self.processes.adopt(name, real.process, real.log_path)
        # Every log in logs/: the real agent writes its own next to its kubeconfig.
        (self.processes.log_dir / f"{name}.log").symlink_to(real.log_path)

    def _wait_for_secret(self, runtime: Runtime, *, timeout: float) -> TokenSecret:
        secret: TokenSecret = self.story.wait_for(
            f"agent {runtime.spec.key} pulls a token and writes "
            f"{world.RUNTIME_NAMESPACE}/{world.TOKEN_SECRET}",
            lambda: world.token_secret(runtime.cluster),
            timeout=timeout,
            guard=self._guard,
            logs=self._logs(runtime.agent, self.broker),
        )
        runtime.compass_runtime_id = secret.runtime_id
        self.story.detail(f"RUNTIME_ID    {secret.runtime_id} (the Compass runtime ID)")
        self.story.detail(f"TENANT        {secret.tenant} (the global account)")
        self.story.detail(f"CONNECTOR_URL {secret.connector_url}")
        self.story.detail(f"TOKEN         {_short(secret.token)}")
        return secret

    def enable_module_in_a(self) -> None:
        runtime = self.runtimes["A"]
        self.story.step(f"The application-connector module is enabled in {runtime.spec.title}")
        self.story.detail(
            world.enable_module(
                self.kcp, runtime.cluster, runtime.spec, real_klm=self.klm is not None
            )
        )
        if self.klm is not None:
            state = self.story.wait_for(
                "lifecycle-manager lists it in the KCP Kyma's status.modules (the broker reads "
                "it there)",
                lambda: real_klm.module_state(self.kcp, runtime.spec, world.MODULE),
                timeout=self._timeout(30),
                guard=self._guard,
                logs=[self.klm.log],
            )
            self.story.detail(
                f"KCP Kyma status.modules: {world.MODULE} {state} (this KCP's catalog has no "
                "ModuleTemplate for it: only the agent's module is published here)"
            )
        self._wait_for_secret(runtime, timeout=self._timeout(30))
        if self.klm is not None:
            outcomes = observe.samples_by_label(
                observe.scrape(f"{self.broker_url}/metrics"),
                "broker_token_requests_total",
                "outcome",
            )
            early = int(outcomes.get("module-not-enabled", 0))
            if early:
                self.story.detail(
                    f"agent A asked at once; the broker answered {early}x 409 module-not-enabled "
                    "until lifecycle-manager listed the module in KCP, and agent A asked again"
                )
        registered = self.compass.runtimes(runtime.spec.global_account)
        self.story.done(
            f"token pulled and secret written; Compass has {len(registered)} runtime for this "
            f"global account: {', '.join(r['name'] for r in registered)}"
        )

    def runtime_agent_connects(self, runtime: Runtime) -> None:
        self.story.step(f"{runtime.runtime_agent_name} in {runtime.spec.title} connects")
        if runtime.real_agent is None:
            self.story.detail(
                "reads the secret, calls Connector `configuration` with Connector-Token, makes an "
                "RSA key and a CSR for the returned subject, `signCertificateSigningRequest`"
            )
            timeout = self._timeout(20)
        else:
            self.story.detail(
                "it acts when its controller resyncs, not when the secret changes: agent "
                f"{runtime.spec.key} hands the token over by annotating the CompassConnection "
                "once the minimal sync time since its last try has passed"
            )
            timeout = self._timeout(2 * REAL_AGENT_SYNC_PERIOD + 30)
        state = self.story.wait_for(
            "CompassConnection compass-connection: Connected",
            lambda: _connected(runtime.cluster),
            timeout=timeout,
            guard=self._guard,
            logs=self._logs(runtime.runtime_agent, runtime.agent),
        )
        subject, not_after = _client_certificate(runtime.cluster)
        if runtime.real_agent is not None:
            state = self.story.wait_for(
                "then it checks the connection at the certificate-secured Connector and syncs "
                "with Director over mTLS: Synchronized",
                lambda: _synchronized(runtime.cluster),
                timeout=self._timeout(2 * REAL_AGENT_SYNC_PERIOD + 30),
                guard=self._guard,
                logs=self._logs(runtime.runtime_agent, runtime.agent),
            )
        self.story.detail(
            "CN is the ID of the SystemAuth in which Director keeps the runtime's one-time "
            "token, as the real Connector names certificates"
        )
        used = self.compass.connector_exchanges(runtime.compass_runtime_id)
        self.story.done(
            f"{state}: client certificate {subject}, valid until {not_after}; "
            f"Connector tokens used: {used} (the one-time token, then the CSR token)"
        )

    def show_mappings(self, *, connected: tuple[str, ...]) -> None:
        """What an operator sees in KCP: every runtime's connection, as its agent reported it."""
        names = " and ".join(f"runtime {key}" for key in connected)
        self.story.step(f"KCP: kubectl get compassmanagermappings -n {world.KCP_NAMESPACE}")
        for key in connected:
            runtime = self.runtimes[key]

            def row_connected(runtime: Runtime = runtime) -> str | None:
                # What the runtime says now: the real agent goes on from Connected to
                # Synchronized, and the mapping is shown once it has been told so too.
                said = world.connection_state(runtime.cluster)
                return _row_says(world.mapping_row(self.kcp, runtime.spec), said)

            self.story.wait_for(
                f"agent {key} reports its CompassConnection; the mapping says "
                f"{world.connection_state(runtime.cluster)}",
                row_connected,
                timeout=self._timeout(20),
                guard=self._guard,
                logs=self._logs(self.runtimes[key].agent, self.broker),
            )
        headers, rows = world.mapping_table(self.kcp)
        for line in table(headers, rows):
            self.story.detail(line)
        waiting = [f"runtime {key}" for key in self.specs if key not in connected]
        self.story.done(
            f"{names} connected, as their agents reported (no Director call)"
            + (f"; {' and '.join(waiting)} not yet" if waiting else "")
        )

    def revoke_b(self) -> None:
        runtime = self.runtimes["B"]
        spec = runtime.spec
        self.story.step(f"An operator revokes {spec.title} in KCP")
        command = world.set_revoked(self.kcp, spec, "demo: decommissioned")
        self.story.detail(command)
        message = self.story.wait_for(
            "agent B's next report is refused with 403 runtime-revoked; it stops asking and "
            "says why in an Event in its runtime",
            lambda: world.runtime_event(runtime.cluster, "RuntimeRevoked"),
            timeout=self._timeout(20),
            guard=self._guard,
            logs=self._logs(runtime.agent, self.broker),
        )
        self.story.detail(f"Event RuntimeRevoked in runtime B: {message}")
        row = self.story.wait_for(
            "KCP: the mapping reads revoked, whatever B last reported",
            lambda: _row_revoked(world.mapping_row(self.kcp, spec)),
            timeout=self._timeout(20),
            guard=self._guard,
            logs=self._logs(self.broker),
        )
        self.story.detail(
            f"STATE {row['STATE']}  CONNECTED {row['CONNECTED']}  REVOKED {row['REVOKED']}"
        )
        command = world.set_revoked(self.kcp, spec, None)
        self.story.detail(f"un-revoked: {command}")
        self.story.wait_for(
            "agent B's next slow re-check gets a token again",
            lambda: _unrevoked(runtime),
            timeout=self._timeout(20),
            guard=self._guard,
            logs=self._logs(runtime.agent, self.broker),
        )
        self.story.done(
            "revocation refused the runtime's tokens and reports without unregistering it from "
            "Compass; un-revoking restored it"
        )

    def take_compass_down(self) -> None:
        self.story.step(
            f"Compass becomes unavailable ({self.compass_name} fault down={self.options.outage})"
        )
        self.compass.set_down(self.options.outage)
        if self.options.outage == "refuse":
            self.story.wait_for(
                "Director, Connector and OAuth refuse connections",
                lambda: not self.compass.listening(),
                timeout=self._timeout(10),
                guard=self._guard,
            )
        self.story.done("Compass is down; runtime A stays Connected, it needs nothing from it")

    def enable_module_in_b_while_down(self) -> None:
        runtime = self.runtimes["B"]
        assert runtime.agent is not None
        self.story.step(f"The module is enabled in {runtime.spec.title} while Compass is down")
        self.story.detail(world.enable_module(self.kcp, runtime.cluster, runtime.spec))
        self._enrol(runtime)
        agent_log = runtime.agent.log_path
        backoffs = self.story.wait_for(
            f"agent B asks, the broker answers 503 + Retry-After, agent B backs off "
            f"({BACKOFFS_TO_SHOW} attempts)",
            lambda: _at_least(observe.agent_backoffs(agent_log), BACKOFFS_TO_SHOW),
            timeout=self._timeout(40),
            guard=self._guard,
            logs=self._logs(runtime.agent, self.broker),
        )
        broker = observe.scrape(f"{self.broker_url}/metrics")
        outcomes = observe.samples_by_label(broker, "broker_token_requests_total", "outcome")
        breaker = observe.sample(broker, "broker_circuit_breaker_open")
        answers = ", ".join(f"{s}: {int(n)}" for s, n in sorted(outcomes.items()) if n)
        self.story.detail(
            f"agent B: {len(backoffs)} temporary answers "
            f"({', '.join(sorted({f'{b.status} {b.reason}' for b in backoffs}))}); "
            f"Retry-After {observe.seconds_list(b.retry_after for b in backoffs)}"
        )
        self.story.detail(
            f"broker: token requests {answers or 'none'}; circuit breaker "
            f"{'open' if breaker else 'closed'}"
        )
        self._check_nothing_failed()
        self.story.done(
            "nothing failed: every process runs, agent B is healthy and keeps retrying, "
            "runtime A is still Connected, runtime B has no secret yet"
        )

    def _enrol(self, runtime: Runtime) -> None:
        """Double opt-in: the agent presents its issuer, an operator approves it in KCP."""
        spec = runtime.spec
        issuer = self.story.wait_for(
            "agent B asks; no kubeconfig Secret, so the broker answers 403 enrolment-pending and "
            "records B's ServiceAccount issuer as pending on its CompassManagerMapping",
            lambda: world.pending_issuer(self.kcp, spec),
            timeout=self._timeout(20),
            guard=self._guard,
            logs=self._logs(runtime.agent, self.broker),
        )
        self.story.detail(f"pending issuer: {issuer} (the broker has not contacted it)")
        message = self.story.wait_for(
            "Warning Event EnrolmentPending on the Kyma in KCP",
            lambda: world.enrolment_event(self.kcp, spec),
            timeout=self._timeout(10),
            guard=self._guard,
            logs=self._logs(self.broker),
        )
        self.story.detail(f"Event: {message.split('. ')[0]}")
        if issuer != runtime.cluster.issuer:
            raise StepFailed(f"the pending issuer {issuer} is not runtime B's")
        command = world.approve_issuer(self.kcp, spec, issuer)
        self.story.detail("the operator checks the issuer with B's owner and approves it:")
        self.story.detail(f"  {command}")

    def _check_nothing_failed(self) -> None:
        self._guard()
        runtime_a, runtime_b = self.runtimes["A"], self.runtimes["B"]
        problems = []
        if not _http_ok(f"{runtime_b.agent_url}/healthz"):
            problems.append("agent B /healthz is not 200")
        if world.token_secret(runtime_b.cluster) is not None:
            problems.append("runtime B has a token secret although Compass is down")
        if world.connection_state(runtime_a.cluster) not in CONNECTED_STATES:
            problems.append("runtime A lost its connection")
        agent_a = observe.scrape(f"{runtime_a.agent_url}/metrics")
        if observe.sample(agent_a, "compass_agent_pull_attempts_total", outcome="temporary"):
            problems.append("agent A asked the broker during the outage")
        if problems:
            raise StepFailed("; ".join(problems), logs=self._logs(runtime_b.agent, self.broker))

    def bring_compass_back(self) -> None:
        runtime = self.runtimes["B"]
        self.story.step(f"Compass is back ({self.compass_name} faults cleared)")
        self.compass.clear_faults()
        self.story.wait_for(
            "Compass listens again",
            self.compass.listening,
            timeout=self._timeout(10),
            guard=self._guard,
        )
        self._wait_for_secret(runtime, timeout=self._timeout(40))
        attempts = observe.samples_by_label(
            observe.scrape(f"{runtime.agent_url}/metrics"),
            "compass_agent_pull_attempts_total",
            "outcome",
        )
        registered = self.compass.runtimes(runtime.spec.global_account)
        self.story.done(
            f"runtime B got its token after {int(attempts.get('temporary', 0))} temporary "
            f"answers ({int(attempts.get('issued', 0))} token issued); Compass has "
            f"{len(registered)} runtime for its global account"
        )

    def delete_kyma_a(self) -> None:
        runtime = self.runtimes["A"]
        spec = runtime.spec
        self.story.step(f"Kyma of {spec.title} is deleted in KCP")
        world.delete_kyma(self.kcp, spec)
        self.story.detail(f"Kyma {world.KCP_NAMESPACE}/{spec.kyma_name} deleted")
        if self.klm is not None:
            self._uninstall_by_klm(runtime)
        self.story.wait_for(
            f"the broker's reconciler unregisters {runtime.compass_runtime_id} from Director",
            lambda: not self.compass.runtimes(spec.global_account),
            timeout=self._timeout(30),
            guard=self._guard,
            logs=self._logs(self.broker),
        )
        self.story.wait_for(
            "its CompassManagerMapping is removed",
            lambda: not world.mapping_exists(self.kcp, spec),
            timeout=self._timeout(15),
            guard=self._guard,
            logs=self._logs(self.broker),
        )
        reasons = observe.samples_by_label(
            observe.scrape(f"{self.broker_url}/metrics"), "broker_unregistrations_total", "reason"
        )
        counted = ", ".join(f"{r}: {int(n)}" for r, n in sorted(reasons.items()) if n)
        self.story.done(
            f"runtime A is no longer in Compass and its mapping is gone "
            f"(broker unregistrations: {counted or 'none'})"
        )

    def _uninstall_by_klm(self, runtime: Runtime) -> None:
        """KLM's order: the module's objects first, then the runtime's Kyma, then its finalizer
        on the KCP Kyma goes. A kubelet would stop the pod of the deleted Deployment: the demo
        stops agent A's process then."""
        assert self.klm is not None
        cluster = runtime.cluster
        self.story.wait_for(
            f"lifecycle-manager removes the module from {runtime.spec.title}: Deployment "
            f"{world.RUNTIME_NAMESPACE}/{real_klm.CONFIG.manager.name} deleted",
            lambda: real_klm.installed(cluster) is None,
            timeout=self._timeout(60),
            guard=self._guard,
            logs=[self.klm.log],
        )
        if runtime.agent is None:
            self.story.detail("the kubelet stops agent A's pod")
        else:
            self.processes.stop(runtime.agent)
            self.story.detail("agent A stopped, as a kubelet stops the pod of a deleted Deployment")
        self.story.wait_for(
            f"then Kyma {world.RUNTIME_NAMESPACE}/default in the runtime, and its KCP Kyma lets go "
            "(lifecycle-manager's finalizer)",
            lambda: (
                world.runtime_kyma(cluster) is None
                and not world.kyma_exists(self.kcp, runtime.spec)
            ),
            timeout=self._timeout(60),
            guard=self._guard,
            logs=[self.klm.log],
        )

    # -- the end -----------------------------------------------------------------------------

    def summarize(self) -> Summary:
        summary = Summary()
        problems = []
        for runtime in self.runtimes.values():
            spec = runtime.spec
            in_compass = [r["id"] for r in self.compass.runtimes(spec.global_account)]
            if not in_compass:
                registration = "unregistered"
            elif in_compass == [runtime.compass_runtime_id]:
                registration = "registered"
            else:
                registration = f"{len(in_compass)} registrations"
                problems.append(f"{spec.title}: {registration} in Compass, expected one")
            calls = self.compass.director_calls(spec.global_account)
            secret = world.token_secret(runtime.cluster)
            said = world.connection_state(runtime.cluster)
            summary.rows.append(
                [
                    spec.title,
                    runtime.compass_runtime_id or "-",
                    registration,
                    "yes" if secret else "no",
                    said,
                    self._mapping_state(runtime, said),
                    str(calls.total),
                ]
            )
            summary.calls[spec.title] = calls.describe()
        expected = {"A": "unregistered", "B": "registered"}
        for key, row in zip(self.runtimes, summary.rows, strict=True):
            real = self.runtimes[key].real_agent is not None
            # The real agent goes on from Connected to Synchronized (Director over mTLS).
            connected = row[4] == ("Synchronized" if real else "Connected")
            if row[2] != expected[key] or not connected or row[3] != "yes":
                problems.append(f"runtime {key}: {row[2]}, secret {row[3]}, {row[4]}")
            if row[5] not in (row[4], "-"):
                problems.append(f"runtime {key}: its mapping says {row[5]}, the runtime {row[4]}")
        self._print_summary(summary)
        if problems:
            raise StepFailed("the end state is not the expected one: " + "; ".join(problems))
        return summary

    def _mapping_state(self, runtime: Runtime, said: str) -> str:
        """STATE of the runtime's mapping once it says `said`, as the agent's next report
        tells it (else what it says at the timeout); "-" when there is no mapping."""
        deadline = time.monotonic() + self._timeout(20)
        while True:
            row = world.mapping_row(self.kcp, runtime.spec)
            if row is None:
                return "-"
            state = row.get("STATE", "<none>")
            if state == said or time.monotonic() > deadline:
                return state
            self._guard()
            time.sleep(0.2)

    def _print_summary(self, summary: Summary) -> None:
        self.story.step("Summary")
        headers = [
            "runtime",
            "Compass runtime ID",
            "in Compass",
            "secret",
            "connection",
            "in KCP",
            "Director calls",
        ]
        self.story.say()
        for line in table(headers, summary.rows):
            self.story.say(f"  {line}")
        self.story.say()
        real = self._real_parts()
        if real:
            self.story.say(f"  Real counterparts: {', '.join(real)} (stand-ins: real-compass.md)")
        self.story.say(f"  Director calls by operation ({self.compass.calls_source}):")
        for title, calls in summary.calls.items():
            self.story.say(f"    {title}: {calls}")
        self.story.say()
        self.story.say(
            "  Runtime A's cluster still holds its secret and certificate: in a real landscape"
        )
        self.story.say("  deleting its Kyma also deprovisions the cluster; here it keeps running.")

    def _real_parts(self) -> list[str]:
        """The counterparts the options ran as the real programs instead of the simulated
        ones."""
        o = self.options
        parts: list[str] = []
        if o.real_director:
            parts.append("Compass Director")
        if o.real_connector:
            parts.append("Connector, hydrator, Oathkeeper")
        if o.klm:
            parts.append("lifecycle-manager (runtime A's module)")
        if o.real_runtime_agent:
            parts.append(f"compass-runtime-agent (runtime {REAL_AGENT_KEY})")
        if o.agent_image is not None:
            parts.append("a node with kubelet and containerd (runtime A)")
        return parts

    # -- keeping it running ------------------------------------------------------------------

    def print_access(self) -> None:
        self.story.say()
        self.story.say("Everything keeps running; Ctrl-C stops it all.")
        for name in CLUSTER_NAMES:
            self.story.say(f"  {name:<10} KUBECONFIG={self.clusters[name].kubeconfig_path}")
        if self.klm is not None:
            self.story.say(
                f"  KLM        log {self.klm.log}; registry {self.klm.landscape.registry.host}"
            )
        if self.real is not None:
            self._print_real_director_access(self.real)
        else:
            self.story.say(f"  Compass    Director {self.sim_urls['director_url']}")
            self.story.say(f"             Connector {self.sim_urls['connector_url']}")
            self.story.say(
                f"             admin {self.sim_urls['admin_url']}/_sim/ "
                f"(e.g. curl {self.sim_urls['admin_url']}/_sim/runtimes)"
            )
            if "certificate_secured_url" in self.sim_urls:
                self.story.say(f"             mTLS {self.sim_urls['certificate_secured_url']}")
        self.story.say(f"  broker     {self.broker_url}  (/metrics, /readyz)")
        for runtime in self.runtimes.values():
            self.story.say(
                f"  agent {runtime.spec.key}    {runtime.agent_url}  (/metrics, /readyz)"
            )
        for runtime in self.runtimes.values():
            if runtime.real_agent is not None:
                self.story.say(
                    f"  compass-runtime-agent in runtime {runtime.spec.key}: log "
                    f"{runtime.real_agent.log_path}"
                )
        self.story.say(f"  logs       {self.processes.log_dir}")

    def _print_real_director_access(self, stack: RealCompass) -> None:
        found = stack.endpoints()
        credentials = self.secrets_dir / "director-credentials.yaml"
        self.story.say(f"  Compass    gateway {stack.gateway_url}")
        self.story.say(f"             Director {stack.director_url} (Bearer from the token URL)")
        self.story.say(f"             token URL {stack.token_url}")
        self.story.say(f"             Connector {stack.connector_url}")
        if "certificate_secured_url" in self.sim_urls:
            self.story.say(
                f"             mTLS {self.sim_urls['certificate_secured_url']} (Connector and "
                "Director for a runtime's client certificate)"
            )
        self.story.say(
            f"             credentials {credentials} (compass-manager's format; e.g. curl -u "
            "<client_id>:<client_secret> -d grant_type=client_credentials <token URL>)"
        )
        self.story.say(
            f"             admin {stack.gateway_url}/_gateway/calls (calls per operation), "
            "/_gateway/faults, /_gateway/down"
        )
        self.story.say(f"             Director itself {found['director_internal_url']}/graphql")
        self.story.say(f"             PostgreSQL {found['postgres']} (Director's database)")
        self.story.say(f"               psql: {postgres.bin_dir() / 'psql'} -d {found['postgres']}")
        self.story.say(f"             Director's log {stack.director_log}")
        if stack.real_connector is not None:
            self.story.say(
                f"             Oathkeeper {stack.real_connector.oathkeeper_url}; logs of "
                f"Oathkeeper, hydrator and Connector in {stack.real_connector.workdir}"
            )

    def keep_running(self) -> None:
        """Until Ctrl-C: refresh the projected tokens as the kubelet would; stop if a child dies."""
        refresh_every = world.SA_TOKEN_SECONDS * 0.8
        while True:
            time.sleep(1.0)
            self._guard()
            if time.monotonic() - self._tokens_projected_at > refresh_every:
                for runtime in self.runtimes.values():
                    if not self._is_pod(runtime):  # the kubelet rotates a pod's own
                        world.project_token(runtime.cluster, runtime.token_file)
                self._tokens_projected_at = time.monotonic()

    # -- cleaning up -------------------------------------------------------------------------

    def close(self) -> None:
        """Stops every process the demo started and removes keys and cluster data."""
        if self.klm is not None:
            self.klm.stop()  # before the API servers it reconciles
        for runtime in self.runtimes.values():
            if runtime.real_agent is not None:
                runtime.real_agent.stop()  # also frees the machine-wide lock on its port
                runtime.real_agent.workdir.joinpath("runtime-agent.kubeconfig").unlink(
                    missing_ok=True
                )
        self.processes.stop_all()
        if self.sim is not None:
            self.sim.close()
        # Director's kubeconfig (KCP's admin) and configuration; its logs stay.
        shutil.rmtree(self.workdir / "real-director" / "home", ignore_errors=True)
        if self.node is not None:
            # Its pods drained, every node process stopped, the host as it was before.
            self.node.stop()
            self.clusters.pop(POD_RUNTIME, None)
        with ThreadPoolExecutor(max_workers=len(CLUSTER_NAMES)) as pool:
            list(pool.map(TestCluster.stop, list(self.clusters.values())))
        self.clusters.clear()
        shutil.rmtree(self.secrets_dir, ignore_errors=True)
        for folder in (self.workdir / "clusters").glob("*"):
            for sensitive in ("etcd", "pki"):
                shutil.rmtree(folder / sensitive, ignore_errors=True)
            (folder / "admin.kubeconfig").unlink(missing_ok=True)


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _row_says(row: dict[str, str] | None, state: str) -> str | None:
    """`state` when the mapping's row says the runtime is connected in that state."""
    if row is None or row.get("CONNECTED") != "True" or row.get("STATE") != state:
        return None
    return state


def _row_revoked(row: dict[str, str] | None) -> dict[str, str] | None:
    """The row once the leader judged the revocation: STATE and CONNECTED from one condition."""
    if row is None or row.get("STATE") != "Revoked":
        return None
    return row


def _unrevoked(runtime: Runtime) -> bool:
    samples = observe.scrape(f"{runtime.agent_url}/metrics")
    return bool(samples) and observe.sample(samples, "compass_agent_revoked") == 0.0


def _agent_ready(runtime: Runtime) -> bool:
    """What a kubelet's readiness probe would ask: the agent's own /readyz, once it listens."""
    return runtime.agent_port != 0 and _http_ok(f"{runtime.agent_url}/readyz")


def _answers_ok(url: str) -> Callable[[], bool]:
    return lambda: _http_ok(url)


def _at_least(items: list[observe.Backoff], count: int) -> list[observe.Backoff] | None:
    return items if len(items) >= count else None


# A CompassConnection with a certificate that works: the real agent's Connected is transient.
CONNECTED_STATES = ("Connected", "Synchronized")


def _connected(cluster: TestCluster) -> str | None:
    state = world.connection_state(cluster)
    return state if state in CONNECTED_STATES else None


def _synchronized(cluster: TestCluster) -> str | None:
    state = world.connection_state(cluster)
    return state if state == "Synchronized" else None


def _client_certificate(cluster: TestCluster) -> tuple[str, str]:
    """Subject and expiry of the certificate the runtime agent stored (nothing secret)."""
    found = cluster.core.read_namespaced_secret("cluster-client-certificates", "kyma-system")
    pem = base64.b64decode((found.data or {})["crt"])
    certificate = x509.load_pem_x509_certificate(pem)
    names = [
        f"{label}={attribute.value!s}"
        for label, oid in (("CN", NameOID.COMMON_NAME), ("O", NameOID.ORGANIZATION_NAME))
        for attribute in certificate.subject.get_attributes_for_oid(oid)
    ]
    return ", ".join(names), certificate.not_valid_after_utc.strftime("%Y-%m-%d %H:%M UTC")
