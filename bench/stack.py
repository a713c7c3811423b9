"""The system under test, started for one scenario run: Compass simulator, broker(s), KCP seed.

Holds: the simulator and each broker replica are separate processes (`python -m
devenv.compass_sim`, `python -m control_plane_broker`) so the fleet's CPU never slows them down
and each broker's own CPU and memory can be read from /proc; each run gets a fresh simulator,
fresh brokers and its own KCP namespace with its own Kyma CRs (and, in `tokenreview` mode, the
runtimes' kubeconfig Secrets), so runs never see each other's registrations or mappings. In
`jwks` mode the issuer is pinned per runtime to the bench's JWKS server; in `tokenreview` mode
the broker asks the runtime API servers named by those Secrets.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import random
import secrets
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.keys import AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, AUDIENCE, RuntimeKey
from bench.procs import Child, python_child, wait_http_ok
from bench.prometheus import parse_request_counts
from kubeapi import Conflict, KubeClient, KubeError, NotFound, access_from_kubeconfig_file

GROUP = "operator.kyma-project.io"
CLIENT_ID = "bench-broker"
MODULE = "application-connector"
RUNTIMES_PER_GLOBAL_ACCOUNT = 10
RFC3339 = "%Y-%m-%dT%H:%M:%SZ"


# --- API servers: the control plane (KCP) and runtimes ------------------------------------------


class ApiServer:
    """Async admin access to one API server (KCP or a runtime), from its admin kubeconfig,
    through the project's one Kubernetes layer (`kubeapi`)."""

    def __init__(self, kubeconfig_path: Path, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig_path = kubeconfig_path
        self._access = access_from_kubeconfig_file(kubeconfig_path)
        self.server = self._access.server

    def client(self) -> KubeClient:
        return KubeClient(self._access, user_agent="bench", timeout=30.0, max_connections=32)

    async def create_namespace(self, name: str) -> None:
        async with self.client() as kube:
            with contextlib.suppress(Conflict):
                await kube.create("/api/v1/namespaces", {"metadata": {"name": name}})

    async def clear_namespace(self, namespace: str, *, concurrency: int = 24) -> int:
        """Removes what a run left in its namespace (Kymas, mappings, Events, Secrets, Leases),
        so that the next run meets an API server (and its watch cache) holding only its own
        objects. The mappings' finalizers go first: no broker is left to release them. The
        namespace itself stays (no namespace controller runs here to finish deleting it).
        Returns the number of mappings removed."""
        mappings = f"/apis/{GROUP}/v1beta1/namespaces/{namespace}/compassmanagermappings"
        gate = asyncio.Semaphore(concurrency)
        async with self.client() as kube:
            listing = await kube.list(mappings)

            async def release(item: Mapping[str, Any]) -> None:
                meta = item.get("metadata") or {}
                if meta.get("finalizers"):
                    async with gate:
                        with contextlib.suppress(NotFound):
                            await kube.merge_patch(
                                f"{mappings}/{meta['name']}", {"metadata": {"finalizers": None}}
                            )

            await asyncio.gather(*(release(item) for item in listing.items))
            for collection in (
                mappings,
                f"/apis/{GROUP}/v1beta2/namespaces/{namespace}/kymas",
                f"/api/v1/namespaces/{namespace}/events",
                f"/api/v1/namespaces/{namespace}/secrets",
                f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
            ):
                await kube.delete(collection)
        return len(listing.items)

    async def seed_kymas(
        self, namespace: str, keys: Sequence[RuntimeKey], *, concurrency: int = 24
    ) -> None:
        """One Kyma CR per runtime, labelled as KEB labels them, with the module enabled."""
        await self.create_all(
            f"/apis/{GROUP}/v1beta2/namespaces/{namespace}/kymas",
            [kyma_object(namespace, i, k) for i, k in enumerate(keys)],
            concurrency=concurrency,
        )

    async def seed_kubeconfigs(
        self,
        namespace: str,
        keys: Sequence[RuntimeKey],
        kubeconfigs: Sequence[str],
        *,
        concurrency: int = 24,
    ) -> None:
        """The runtime kubeconfig Secrets as KEB writes them: `kubeconfig-<runtime id>`, key
        `config`, labelled with the Kyma name; runtime i gets `kubeconfigs[i mod len]`."""
        await self.create_all(
            f"/api/v1/namespaces/{namespace}/secrets",
            [
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": f"kubeconfig-{key.runtime_id.lower()}",
                        "namespace": namespace,
                        "labels": {"operator.kyma-project.io/kyma-name": key.runtime_id.lower()},
                    },
                    "data": {
                        "config": base64.b64encode(
                            kubeconfigs[i % len(kubeconfigs)].encode()
                        ).decode()
                    },
                }
                for i, key in enumerate(keys)
            ],
            concurrency=concurrency,
        )

    async def create_all(
        self, path: str, bodies: Sequence[dict[str, Any]], *, concurrency: int
    ) -> None:
        """POSTs every body to `path`, `concurrency` at a time; any failure fails the run."""
        gate = asyncio.Semaphore(concurrency)
        async with self.client() as kube:

            async def create(body: dict[str, Any]) -> None:
                async with gate:
                    try:
                        await kube.create(path, body)
                    except KubeError as exc:
                        kind = body.get("kind", "an object")
                        raise RuntimeError(f"creating {kind} failed: {exc}") from exc

            await asyncio.gather(*(create(b) for b in bodies))

    async def service_account_tokens(
        self,
        namespace: str,
        name: str,
        *,
        count: int,
        audience: str,
        seconds: int,
        concurrency: int = 16,
    ) -> list[str]:
        """`count` TokenRequest tokens of `namespace/name` (created with its namespace if
        missing), each bound to `audience`, as a kubelet would project them."""
        async with self.client() as kube:
            for path, body in (
                ("/api/v1/namespaces", {"metadata": {"name": namespace}}),
                (f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}}),
            ):
                with contextlib.suppress(Conflict):
                    await kube.create(path, body)
            gate = asyncio.Semaphore(concurrency)
            path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
            request = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"audiences": [audience], "expirationSeconds": seconds},
            }

            async def one() -> str:
                async with gate:
                    review = await kube.create(path, request)
                    return str(review["status"]["token"])

            return list(await asyncio.gather(*(one() for _ in range(count))))

    async def request_counts(self) -> dict[str, int]:
        """`VERB resource` -> requests served so far, from the API server's own /metrics (text,
        not JSON: read with the same cluster access, outside the JSON client)."""
        async with httpx.AsyncClient(
            base_url=self.server, verify=self._access.ssl_context(), timeout=30.0
        ) as http:
            response = await http.get("/metrics")
            response.raise_for_status()
            return parse_request_counts(response.text)

    async def spread_report_ages(
        self, namespace: str, names: Sequence[str], *, oldest: float, concurrency: int = 24
    ) -> bool:
        """Sets each mapping's recorded `status.connection.lastReportAt` to a time between now and
        `oldest` seconds ago (uniform), as a fleet's are in steady state. False (nothing
        written) when the mappings carry no recorded report."""
        base = f"/apis/{GROUP}/v1beta1/namespaces/{namespace}/compassmanagermappings"
        ages = random.Random(11)
        now = time.time()
        gate = asyncio.Semaphore(concurrency)
        async with self.client() as kube:
            if not names:
                return False
            first = await kube.get(f"{base}/{names[0]}")
            if not ((first.get("status") or {}).get("connection") or {}).get("lastReportAt"):
                return False

            async def one(name: str) -> None:
                at = datetime.fromtimestamp(now - ages.uniform(0.0, oldest), UTC)
                body = {"status": {"connection": {"lastReportAt": at.strftime(RFC3339)}}}
                async with gate:
                    await kube.merge_patch(f"{base}/{name}/status", body)

            await asyncio.gather(*(one(name) for name in names))
        return True

    async def mappings(self, namespace: str) -> list[dict[str, Any]]:
        async with self.client() as kube:
            listing = await kube.list(
                f"/apis/{GROUP}/v1beta1/namespaces/{namespace}/compassmanagermappings"
            )
            return [dict(item) for item in listing.items]


def global_account(index: int) -> str:
    return f"ga-bench-{index // RUNTIMES_PER_GLOBAL_ACCOUNT:05d}"


def kyma_object(namespace: str, index: int, key: RuntimeKey) -> dict[str, Any]:
    name = key.runtime_id.lower()
    labels = {
        "kyma-project.io/runtime-id": key.runtime_id,
        "kyma-project.io/global-account-id": global_account(index),
        "kyma-project.io/subaccount-id": f"sa-bench-{index:05d}",
        "kyma-project.io/shoot-name": f"c-{key.kid[:7]}",
        "kyma-project.io/instance-id": f"inst-{key.kid}",
        "kyma-project.io/broker-plan-id": "4deee563-e5ec-4731-b9b1-53b42d855f0c",
        "kyma-project.io/broker-plan-name": "azure",
        "kyma-project.io/region": "westeurope",
        "operator.kyma-project.io/kyma-name": name,
    }
    return {
        "apiVersion": f"{GROUP}/v1beta2",
        "kind": "Kyma",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"channel": "regular", "modules": [{"name": MODULE}]},
    }


# --- the Compass simulator -------------------------------------------------------------------


@dataclass(frozen=True)
class DirectorCall:
    """One call that reached Compass: a Director operation, or the OAuth token endpoint."""

    endpoint: str  # director | oauth
    at: float  # wall clock, seconds
    operation: str
    outcome: str
    status: int | None
    duration: float  # seconds the simulator spent on it (its queue, latency, handler)


@dataclass
class Simulator:
    child: Child
    urls: dict[str, str]
    secret: str = field(repr=False)
    calls: list[DirectorCall] = field(default_factory=list)
    client_id: str = CLIENT_ID  # the OAuth client the brokers' credentials file names
    lost_records: int = 0  # records the simulator's bounded log dropped before we read them
    _since: int = 0

    @property
    def director_calls(self) -> list[DirectorCall]:
        return [c for c in self.calls if c.endpoint == "director"]

    @property
    def admin(self) -> str:
        return self.urls["admin_url"].rstrip("/") + "/_sim"

    async def patch_faults(self, http: httpx.AsyncClient, **changes: Any) -> None:
        response = await http.patch(f"{self.admin}/faults", json=changes)
        response.raise_for_status()

    async def poll_calls(self, http: httpx.AsyncClient) -> int:
        """Fetches request records since the last poll; returns how many were new."""
        response = await http.get(f"{self.admin}/requests", params={"since": self._since})
        response.raise_for_status()
        records: list[dict[str, Any]] = response.json()
        if records and int(records[0]["seq"]) > self._since + 1:
            self.lost_records += int(records[0]["seq"]) - self._since - 1
        for r in records:
            self._since = max(self._since, int(r["seq"]))
            if r["endpoint"] not in ("director", "oauth"):
                continue
            self.calls.append(
                DirectorCall(
                    endpoint=str(r["endpoint"]),
                    at=datetime.fromisoformat(r["at"]).timestamp(),
                    operation=str(r["operation"]),
                    outcome=str(r["outcome"]),
                    status=r.get("http_status"),
                    duration=float(r.get("duration_seconds") or 0.0),
                )
            )
        return len(records)

    async def get(self, http: httpx.AsyncClient, what: str) -> Any:
        response = await http.get(f"{self.admin}/{what}")
        response.raise_for_status()
        return response.json()


def start_simulator(workdir: Path, *, capacity: int | None, latency: float) -> Simulator:
    secret = secrets.token_urlsafe(24)
    args = ["--client-id", CLIENT_ID, "--log-level", "warning"]
    if capacity is not None:
        args += ["--max-concurrent", str(capacity)]
    if latency > 0:
        args += ["--latency", str(latency)]
    env = {**os.environ, "COMPASS_SIM_CLIENT_SECRET": secret}
    child = python_child(
        "compass-sim",
        "devenv.compass_sim",
        *args,
        env=env,
        log_path=workdir / "compass-sim.log",
        capture_stdout=True,
    )
    urls = {k: str(v) for k, v in child.first_stdout_json(timeout=30).items()}
    return Simulator(child=child, urls=urls, secret=secret)


# --- the broker ------------------------------------------------------------------------------


@dataclass
class Broker:
    child: Child
    url: str

    @property
    def pid(self) -> int:
        return self.child.pid


def free_port() -> int:
    import socket  # noqa: PLC0415 (only here)

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def broker_env(
    *,
    kcp: ApiServer,
    namespace: str,
    sim: Simulator,
    creds_file: Path,
    identity_mode: str,
    jwks_issuer_template: str,
    port: int,
    max_concurrency: int,
    overrides: Mapping[str, str],
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env.update(
        {
            "KUBECONFIG": str(kcp.kubeconfig_path),
            "BROKER_DIRECTOR_URL": sim.urls["director_url"],
            "BROKER_DIRECTOR_CREDENTIALS_FILE": str(creds_file),
            "BROKER_DIRECTOR_MAX_CONCURRENCY": str(max_concurrency),
            "BROKER_IDENTITY_MODE": identity_mode,
            "BROKER_AUDIENCE": AUDIENCE,
            "BROKER_ALLOWED_SERVICE_ACCOUNTS": f"{AGENT_NAMESPACE}/{AGENT_SERVICE_ACCOUNT}",
            "BROKER_KCP_NAMESPACE": namespace,
            "BROKER_LEASE_NAMESPACE": namespace,
            "BROKER_HOST": "127.0.0.1",
            "BROKER_PORT": str(port),
        }
    )
    if identity_mode == "jwks":
        env["BROKER_JWKS_ISSUER_URL"] = jwks_issuer_template
    env.update(overrides)
    return env


def start_brokers(
    workdir: Path,
    *,
    replicas: int,
    kcp: ApiServer,
    namespace: str,
    sim: Simulator,
    identity_mode: str,
    jwks_issuer_template: str,
    max_concurrency: int,
    overrides: Mapping[str, str],
    cprofile_first: bool = False,
) -> list[Broker]:
    """`replicas` broker processes on the same namespace, Director and settings (they share the
    leader Lease); returns once every one is ready. With `cprofile_first`, the first runs under
    cProfile and writes broker.prof into the run folder when it exits."""
    creds = workdir / "director-credentials.yaml"
    creds.touch(mode=0o600)
    creds.write_text(
        yaml.safe_dump(
            {
                "data": {
                    "client_id": sim.client_id,
                    "client_secret": sim.secret,
                    "tokens_endpoint": sim.urls["token_url"],
                }
            }
        )
    )
    brokers: list[Broker] = []
    try:
        for index in range(replicas):
            port = free_port()
            env = broker_env(
                kcp=kcp,
                namespace=namespace,
                sim=sim,
                creds_file=creds,
                identity_mode=identity_mode,
                jwks_issuer_template=jwks_issuer_template,
                port=port,
                max_concurrency=max_concurrency,
                overrides=overrides,
            )
            module_args: tuple[str, ...] = ("control_plane_broker",)
            if cprofile_first and index == 0:
                profile = str(workdir / "broker.prof")
                module_args = ("cProfile", "-o", profile, "-m", "control_plane_broker")
            child = python_child(
                f"compass-broker-{index}",
                module_args[0],
                *module_args[1:],
                env=env,
                log_path=workdir / f"broker-{index}.log",
            )
            brokers.append(Broker(child=child, url=f"http://127.0.0.1:{port}"))
        for broker in brokers:
            wait_http_ok(f"{broker.url}/readyz", timeout=120, child=broker.child)
    except BaseException:
        for broker in brokers:
            broker.child.stop()
        raise
    return brokers


def run_workdir(base: Path, name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))


def unique_namespace(prefix: str) -> str:
    return f"{prefix}-{int(time.time()) % 100000}-{secrets.token_hex(2)}"
