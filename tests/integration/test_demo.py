"""The local demo end to end, run the way a user runs it: `python -m devenv.demo` as a process.

`test_runtime_agent_sim_*` checks the simulated compass-runtime-agent's exchange on its own,
against the Compass simulator in-process (fast, no clusters). The first demo test lets the whole
story run and checks what it says it did (the steps in order, the back-off while Compass is down,
the summary table) and that it leaves no process and no key behind. The same story runs on the
real Director (`--real-director`, skipped where its source cannot be had) and with the real
compass-runtime-agent in runtime B (`--real-runtime-agent`, skipped without root, unshare or its
source; about a minute more, for its resyncs), and on the whole real path but the node: real
Director, Connector, hydrator, Oathkeeper, compass-runtime-agent and lifecycle-manager (about 25 s
more than without KLM). Another test interrupts the demo in the middle, as
Ctrl-C would, and checks the same clean-up; one checks that options that cannot work here are
refused at once. All start their own clusters through the demo (not the session fixtures).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from devenv import runtime_agent
from devenv.compass_sim import CompassSimulator, SimConfig
from devenv.compass_sim.testing import REQUEST_ONE_TIME_TOKEN, DirectorClient, fetch_token
from devenv.demo import cli
from devenv.demo import klm as real_klm
from devenv.real_director import find_compass_source
from devenv.runtime_agent_sim import ExchangeError, exchange_token

REPO_ROOT = Path(__file__).resolve().parents[2]
MARKER = "KYMA_COMPASS_PULL_DEMO"  # the demo puts it, with its work folder, in every child's env
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
JWT = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")
REAL_RUNTIME_AGENT = "compass-runtime-agent (real, 859cac3)"


def demo_command(workdir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "devenv.demo", "--workdir", str(workdir), *args]


def leftovers(workdir: Path) -> list[str]:
    """Processes still running that the demo started: by the marker in their environment, by
    a home in the work folder (the real Director, the real compass-runtime-agent), by the work
    folder in their command line (etcd, kube-apiserver), or by a pid it recorded."""
    found = set()
    mark = f"{MARKER}={workdir}".encode()
    home = f"HOME={workdir}/".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        variables = environ.split(b"\0")
        at_home = any(v.startswith(home) for v in variables)
        if mark in variables or at_home or str(workdir).encode() in cmdline:
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.add(f"{proc.name}: {command}")
    registry = workdir / "processes.json"
    for entry in json.loads(registry.read_text()) if registry.exists() else []:
        try:
            cmdline = Path(f"/proc/{entry['pid']}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.split(b"\0")[:-1] == [a.encode() for a in entry["argv"]]:
            found.add(f"{entry['pid']}: {entry['name']}")
    return sorted(found)


def summary_rows(output: str) -> dict[str, dict[str, str]]:
    """The summary table as {runtime: {column: value}}; columns are apart by two spaces."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("runtime  "))
    names = re.split(r"\s{2,}", lines[start].strip())
    rows = {}
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        row = dict(zip(names, re.split(r"\s{2,}", line.strip()), strict=True))
        rows[row["runtime"]] = row
    return rows


def one_time_token(sim: CompassSimulator, http: httpx.Client) -> tuple[str, str]:
    """A Director one-time token for a fresh runtime: (Compass runtime ID, token)."""
    runtime = sim.seed_runtime(tenant="ga-demo", name="demo-runtime")
    access = fetch_token(http, sim.token_url, client_id="demo", client_secret="demo-secret")
    director = DirectorClient(http, sim.director_url, token=access, tenant="ga-demo")
    result = director.result(REQUEST_ONE_TIME_TOKEN, {"id": runtime.id})
    return runtime.id, result["token"]


def test_runtime_agent_sim_exchanges_a_token_for_a_certificate_once() -> None:
    with (
        CompassSimulator(SimConfig(client_id="demo", client_secret="demo-secret")).running() as sim,
        httpx.Client(timeout=10) as http,
    ):
        runtime_id, token = one_time_token(sim, http)
        issued = exchange_token(http, sim.connector_url, token)
        certificate = x509.load_pem_x509_certificate(issued.client_pem)
        common_names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        # Named, as Compass names it, after the SystemAuth holding both tokens.
        (auth_id,) = {t.system_auth_id for t in sim.connector_tokens(runtime_id)}
        assert [a.value for a in common_names] == [auth_id]
        assert issued.subject.endswith(f"CN={auth_id}")
        assert b"PRIVATE KEY" in issued.key_pem
        assert issued.not_after > issued.not_before
        assert sim.counter("signCertificateSigningRequest").successes == 1
        # One-time: the same token again is refused, and the refusal names no token.
        with pytest.raises(ExchangeError) as refused:
            exchange_token(http, sim.connector_url, token)
        assert str(refused.value) == "graphql: server returned a non-200 status code: 400"
        assert sim.counter("signCertificateSigningRequest").attempts == 1


def run_demo(workdir: Path, *args: str, timeout: float = 220) -> str:
    """Runs the demo to its end; its stdout, once it exited 0 and left nothing running."""
    result = subprocess.run(
        demo_command(workdir, *args),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, f"demo failed:\n{out[-6000:]}\n{result.stderr[-3000:]}"
    assert leftovers(workdir) == []
    # Nothing secret printed; keys, tokens and cluster data removed; the logs kept.
    assert not JWT.search(out + result.stderr)
    assert re.search(r"TOKEN\s+\d+ chars, sha256:[0-9a-f]{12}", out)
    assert not (workdir / "secrets").exists()
    assert not list((workdir / "clusters").glob("*/etcd"))
    assert not list((workdir / "clusters").glob("*/pki"))
    for name in ("broker", "agent-a", "agent-b", "runtime-agent-b"):
        assert (workdir / "logs" / f"{name}.log").stat().st_size > 0
    return out


def check_story(out: str, *, compass: str, runtime_agent_b: str) -> None:
    """The whole story happened, in order, and ended as it should (`compass`: the step that
    starts Compass; `runtime_agent_b`: how runtime B's compass-runtime-agent is named)."""
    milestones = [
        "Three API servers",
        "The agent's Kyma module kyma-project.io/module/compass-agent",
        "no broker URL, no runtime ID in it",
        compass,
        "KCP: Kyma CRs and runtime kubeconfig Secrets",
        "no kubeconfig Secret: KCP cannot reach this cluster",
        "the agent arrives as the compass-agent Kyma module",
        "compass-agent added to spec.modules of Kyma kyma-system/default",
        "lifecycle-manager applies the release manifest",
        "the customer applies the community module's manifest",
        "runtime ID from the module's ConfigMap",
        "Broker in the control plane",
        "One agent per runtime",
        "module is enabled in runtime A (managed)",
        "agent A pulls a token and writes kyma-system/compass-agent-configuration",
        "compass-runtime-agent (simulated) in runtime A (managed) connects",
        "Compass becomes unavailable",
        "module is enabled in runtime B (BYOC) while Compass is down",
        "403 enrolment-pending",
        "pending issuer: https://127.0.0.1:",
        "Event: ServiceAccount issuer https://127.0.0.1:",
        "the operator checks the issuer with B's owner and approves it:",
        "compass-broker.kyma-project.io/issuer-approved=https://127.0.0.1:",
        "agent B backs off",
        "nothing failed",
        "KCP: kubectl get compassmanagermappings -n kcp-system",
        "the mapping says Connected",
        "runtime A connected, as their agents reported",
        "Compass is back",
        "agent B pulls a token",
        f"{runtime_agent_b} in runtime B (BYOC) connects",
        "runtime A and runtime B connected, as their agents reported",
        "An operator revokes runtime B (BYOC) in KCP",
        'compass-broker.kyma-project.io/revoked="demo: decommissioned"',
        "Event RuntimeRevoked in runtime B",
        "KCP: the mapping reads revoked, whatever B last reported",
        "STATE Revoked  CONNECTED False  REVOKED demo: decommissioned",
        "un-revoked: kubectl -n kcp-system annotate compassmanagermapping",
        "agent B's next slow re-check gets a token again",
        "Kyma of runtime A (managed) is deleted in KCP",
        "runtime A is no longer in Compass and its mapping is gone",
        "Summary",
        "every step happened",
    ]
    positions = [out.find(m) for m in milestones]
    assert -1 not in positions, [m for m, p in zip(milestones, positions, strict=True) if p < 0]
    assert positions == sorted(positions), "the steps are out of order"
    assert "✗" not in out

    # While Compass was down agent B got 503 + Retry-After and backed off.
    backoff = re.search(
        r"agent B: (\d+) temporary answers \(503 compass-unavailable\); Retry-After (.+)", out
    )
    assert backoff is not None, out
    assert int(backoff.group(1)) >= 3
    assert all(float(s.rstrip("s")) >= 1 for s in backoff.group(2).split(", "))
    assert re.search(r"broker: token requests compass-unavailable: \d+", out)

    # Compass (simulator or Director's database) holds one runtime per Kyma when each connects.
    assert "Compass has 1 runtime for this global account" in out
    assert "Compass has 1 runtime for its global account" in out

    # The summary: A connected, then unregistered after its Kyma was deleted; B registered once
    # (exactly its runtime ID in Compass, else the row says how many) and connected after the
    # outage; each with the Director calls Compass recorded.
    rows = summary_rows(out)
    a, b = rows["runtime A (managed)"], rows["runtime B (BYOC)"]
    b_connected = "Synchronized" if "(real" in runtime_agent_b else "Connected"
    assert (a["in Compass"], a["secret"], a["connection"]) == ("unregistered", "yes", "Connected")
    assert (b["in Compass"], b["secret"], b["connection"]) == ("registered", "yes", b_connected)
    # KCP's mapping says what the runtime says (A's mapping went with its Kyma).
    assert (a["in KCP"], b["in KCP"]) == ("-", b_connected)
    # Before its token, B waits for one: no failed connection in KCP.
    waiting = out[out.index("the mapping says Connected") : out.index("Compass is back")]
    assert "AwaitingToken" in waiting, waiting
    assert "ConnectionFailed" not in waiting, waiting
    assert UUID.match(a["Compass runtime ID"])
    assert UUID.match(b["Compass runtime ID"])
    assert a["Compass runtime ID"] != b["Compass runtime ID"]
    # A runtime whose mapping the broker created needs no look-up, also when its first
    # attempts met Compass down (they failed before a request left): A register, token,
    # unregister; B register, token.
    assert int(a["Director calls"]) >= 3
    assert int(b["Director calls"]) >= 2
    by_operation = {
        m.group(1): m.group(2) for m in re.finditer(r"^\s+(runtime [AB] \(\w+\)): (.+)$", out, re.M)
    }
    assert "registerRuntime: 1," in by_operation["runtime A (managed)"]
    assert "unregisterRuntime: 1" in by_operation["runtime A (managed)"]
    assert "registerRuntime: 1," in by_operation["runtime B (BYOC)"]
    assert "unregisterRuntime" not in by_operation["runtime B (BYOC)"]


def took_seconds(out: str) -> float:
    took = re.search(r"the demo took ([\d.]+)s", out)
    assert took is not None
    return float(took.group(1))


STEP = re.compile(r"^\[ *[\d.]+s\] (\d+\. .*)$", re.MULTILINE)


def documented_steps() -> list[str]:
    """The numbered steps of docs/demo.md's first sample output (the default demo)."""
    doc = (REPO_ROOT / "docs" / "demo.md").read_text()
    start = doc.index("## Sample output")
    sample = doc[doc.index("```text", start) : doc.index("```\n", doc.index("```text", start) + 7)]
    return STEP.findall(sample)


@pytest.mark.timeout(240)
def test_the_demo_tells_the_whole_story_and_leaves_nothing_running(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    out = run_demo(workdir)
    check_story(
        out,
        compass="Compass simulator",
        runtime_agent_b="compass-runtime-agent (simulated)",
    )
    assert "Director calls by operation (as the simulator recorded them)" in out
    assert (workdir / "logs" / "compass-sim.log").stat().st_size > 0
    assert took_seconds(out) < 120
    # docs/demo.md shows the output of this very story, step by step.
    assert STEP.findall(out) == documented_steps()


@pytest.mark.timeout(300)
def test_the_demo_on_the_real_director(tmp_path: Path) -> None:
    where, reason = find_compass_source()
    if where is None:
        pytest.skip(f"the real Compass Director cannot be built here: {reason}")
    workdir = tmp_path / "demo"
    out = run_demo(workdir, "--real-director", timeout=280)
    check_story(
        out,
        compass="The real Compass Director (kyma-incubator/compass a423d60704) behind our gateway",
        runtime_agent_b="compass-runtime-agent (simulated)",
    )
    assert "Compass becomes unavailable (gateway fault down=refuse)" in out
    assert "Compass is back (gateway faults cleared)" in out
    # The runtime agents' tokens are Director's, spent at the gateway's Connector.
    assert out.count("Connector tokens used: 2 (the one-time token, then the CSR token)") == 2
    assert "CN is the ID of the SystemAuth in which Director keeps the runtime's" in out
    assert "Director calls by operation (as the gateway counted them in front of the real" in out
    # Director and PostgreSQL were listed while they ran, and are gone (leftovers() above).
    listed = {e["name"] for e in json.loads((workdir / "processes.json").read_text())}
    assert {"real-director-director", "real-director-postgres"} <= listed
    assert (workdir / "real-director" / "director.log").stat().st_size > 0
    assert not (workdir / "real-director" / "home").exists()  # Director's kubeconfig
    assert took_seconds(out) < 120


def test_options_that_cannot_work_here_are_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without root the real compass-runtime-agent cannot run: said before anything starts.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code = cli.main(["--workdir", str(tmp_path / "demo"), "--real-runtime-agent"])
    assert code == 2
    assert not (tmp_path / "demo").exists()
    args = cli.build_parser().parse_args(["--real-runtime-agent"])
    refusal, _ = cli.preflight(args)
    assert refusal is not None
    assert "needs root and unshare" in refusal
    # Without the Director's source (as where it cannot be had), likewise.
    monkeypatch.setattr(cli, "find_compass_source", lambda: (None, "no source in /nowhere"))
    refusal, _ = cli.preflight(cli.build_parser().parse_args(["--real-director"]))
    assert refusal == "--real-director needs the pinned Compass source: no source in /nowhere"
    # The real Connector exchanges the real Director's tokens: not without it.
    refusal, _ = cli.preflight(cli.build_parser().parse_args(["--real-connector"]))
    assert refusal == (
        "--real-connector needs --real-director: it exchanges the real Director's tokens"
    )
    # The whole real path is refused with the first part that cannot run, at once (exit 2).
    refusal, _ = cli.preflight(cli.build_parser().parse_args(["--all-real"]))
    assert refusal == (
        "--all-real: --real-director needs the pinned Compass source: no source in /nowhere"
    )
    assert cli.main(["--workdir", str(tmp_path / "demo"), "--all-real"]) == 2
    args = cli.build_parser().parse_args(["--all-real"])
    cli.preflight(args)
    real = ("real_director", "real_connector", "real_runtime_agent", "klm", "agent_pod")
    assert all(getattr(args, option) for option in real)
    assert not (tmp_path / "demo").exists()


def test_klm_is_refused_without_its_build_or_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No build in the cache and no source (build.sh exits 3): said with build.sh's reason.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("KLM_SRC", raising=False)
    refusal, _ = cli.preflight(cli.build_parser().parse_args(["--klm"]))
    assert refusal is not None
    assert refusal.startswith(
        "--klm needs lifecycle-manager's build or its source: the lifecycle-manager source is "
        "not here: set KLM_SRC"
    )
    assert not (tmp_path / "cache" / "kyma-compass-pull").exists()  # nothing built or unpacked


@pytest.mark.timeout(120)
def test_ctrl_c_in_the_middle_stops_every_process(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    proc = subprocess.Popen(
        demo_command(workdir),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    agents_started = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "agent A /readyz" in line:
                agents_started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert agents_started.wait(90), "".join(lines)
        time.sleep(0.5)
        assert len(json.loads((workdir / "processes.json").read_text())) == 6
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
        assert proc.stdout is not None
        proc.stdout.close()
    out = "".join(lines)
    assert code == 130, out
    assert "interrupted" in out
    assert "✓ stopped" in out
    assert leftovers(workdir) == []
    assert not (workdir / "secrets").exists()


def _real_runtime_agent_or_skip() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("the real compass-runtime-agent needs root and unshare(1) outside a pod")
    try:
        runtime_agent.build()
    except runtime_agent.RuntimeAgentUnavailable as exc:
        if exc.source_missing:
            pytest.skip(f"the real compass-runtime-agent cannot be built here: {exc.reason}")
        raise
    # One real agent per machine (port 8080): another one running here (a benchmark) is not
    # this test's failure. In CI nothing else holds it.
    lock = runtime_agent._lock_path()
    if lock.exists():
        with lock.open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pytest.skip(f"another real compass-runtime-agent runs on this machine ({lock})")
            fcntl.flock(handle, fcntl.LOCK_UN)


# The real agent acts on its resyncs (the demo sets 10 s): about a minute more than the default.
@pytest.mark.timeout(420)
def test_the_demo_with_the_real_compass_runtime_agent(tmp_path: Path) -> None:
    _real_runtime_agent_or_skip()
    workdir = tmp_path / "demo"
    out = run_demo(workdir, "--real-runtime-agent", timeout=400)
    check_story(
        out,
        compass="Compass simulator",
        runtime_agent_b=REAL_RUNTIME_AGENT,
    )
    assert "as ServiceAccount kyma-system/compass-runtime-agent (its own RBAC)" in out
    assert "mTLS      https://127.0.0.1:" in out  # the certificate-secured side it syncs with
    assert re.search(r"Synchronized: client certificate CN=[0-9a-f-]{36}", out)
    listed = {e["name"] for e in json.loads((workdir / "processes.json").read_text())}
    assert "runtime-agent-b" in listed
    assert not (workdir / "runtime-agent-b" / "runtime-agent.kubeconfig").exists()
    assert took_seconds(out) < 240


# The whole real path but the node (--all-real without --agent-pod: a node is one per machine,
# and the node tests hold the session's): the real Director, Connector, hydrator and Oathkeeper
# take the broker's tokens, the real agent syncs over the certificate-secured side (our front in
# Istio's place), and the real lifecycle-manager installs runtime A's module from make module's
# output.
@pytest.mark.timeout(420)
def test_the_demo_on_the_whole_real_path_but_the_node(tmp_path: Path) -> None:
    where, reason = find_compass_source()
    if where is None:
        pytest.skip(f"the real Compass Director cannot be built here: {reason}")
    _real_runtime_agent_or_skip()
    refusal = cli.preflight(cli.build_parser().parse_args(["--real-director", "--real-connector"]))[
        0
    ]
    if refusal is not None:
        pytest.skip(refusal)
    refusal = real_klm.why_not_here()
    if refusal is not None:
        pytest.skip(refusal)
    workdir = tmp_path / "demo"
    real = ["--real-director", "--real-connector", "--real-runtime-agent", "--klm"]
    out = run_demo(workdir, *real, timeout=400)
    check_whole_real_story(out)
    assert "then the Connector: all real" in out
    assert "a client certificate's CN names the runtime's SystemAuth" in out
    check_lifecycle_manager(out, workdir)
    listed = {e["name"] for e in json.loads((workdir / "processes.json").read_text())}
    assert {
        "real-director-oathkeeper",
        "real-director-hydrator",
        "real-director-connector",
        "runtime-agent-b",
    } <= listed
    assert (
        "Real counterparts: Compass Director, Connector, hydrator, Oathkeeper, lifecycle-manager "
        "(runtime A's module), compass-runtime-agent (runtime B)"
    ) in out
    assert took_seconds(out) < 240


def check_whole_real_story(out: str) -> None:
    """The story on Compass's own Director, Connector, hydrator and Oathkeeper, with the real
    compass-runtime-agent in runtime B synchronized through them."""
    check_story(
        out,
        compass=(
            "The real Compass Director, Connector, hydrator and Oathkeeper (kyma-incubator/compass "
            "a423d60704, ory/oathkeeper v0.40.6)"
        ),
        runtime_agent_b=REAL_RUNTIME_AGENT,
    )
    # Named by the real Connector, with Compass's default subject.
    assert re.search(r"Synchronized: client certificate CN=[0-9a-f-]{36}, O=Org", out)


def check_lifecycle_manager(out: str, workdir: Path, *, on_node: bool = False) -> None:
    """Runtime A's module came from the real KLM: what only KLM writes is in the story. On a
    node the Deployment's status is the controller manager's and the kubelet stops the pod."""
    assert "The real lifecycle-manager (kyma-project/lifecycle-manager c5b83f1)" in out
    # KLM's Manifest name (<kyma>-compass-agent-<hash>) in its component label and owner
    # annotation, its field manager: the imitation would name <kyma>-compass-agent.
    applied = re.search(
        r"runtime A \(managed\): lifecycle-manager applies the release manifest \(field manager "
        r"([^)]*)\): Deployment kyma-system/compass-agent with app\.kubernetes\.io/component="
        r"([0-9a-f-]{36}-compass-agent-\d+), deprecated-operator\.kyma-project\.io/owned-by="
        r"kcp-system/(\S+)$",
        out,
        re.M,
    )
    assert applied is not None, out
    assert "declarative.kyma-project.io/applier" in applied.group(1).split(", ")
    assert applied.group(3) == applied.group(2)
    # The watcher's KCP_ADDR on KLM's skr-webhook; the module state from agent A's /readyz.
    assert "skr-webhook KCP_ADDR=skr-events.kcp.example.test:443" in out
    assert re.search(
        r"Kyma kcp-system/[0-9a-f-]{36}: module compass-agent Ready, Kyma Ready "
        r"\(lifecycle-manager's status\)",
        out,
    )
    # application-connector is listed from the runtime's Kyma (the broker reads it there).
    assert re.search(r"KCP Kyma status\.modules: application-connector \w+", out)
    # Kyma deletion: KLM removes the module, then the runtime's Kyma; its finalizer lets go.
    assert "lifecycle-manager removes the module from runtime A (managed)" in out
    if on_node:
        status = "module compass-agent Ready (from the Deployment status kube-controller-manager "
        assert status in out
        assert "the kubelet stops agent A's pod" in out
    else:
        assert "agent A stopped, as a kubelet stops the pod of a deleted Deployment" in out
    listed = {e["name"] for e in json.loads((workdir / "processes.json").read_text())}
    assert {"lifecycle-manager", "ocm-registry"} <= listed
    assert (workdir / "klm" / "lifecycle-manager.log").stat().st_size > 0
