"""What a real node needs from the host, what it changes there, and how that is undone.

A node is not a set of processes alone: the kubelet, containerd, runc, the CNI bridge plugin and
kube-proxy change the host itself (cgroups, a bridge and veths, network namespaces, nft tables,
mounts, sysctls, a few fixed paths outside their own folders). `snapshot()` records what a test
compares before and after; `restore()` undoes what a node left behind, using the snapshot taken
before it started to tell the node's traces from what was there already.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The sysctls a node is known to change: the kubelet's kernel tunables (setupKernelTunables in
# pkg/kubelet/cm/container_manager_linux.go: overcommit always, panic 10 s after an oops) and the
# bridge plugin's forwarding. Read and compared as /proc/sys paths.
NODE_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/forwarding",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv6/conf/all/forwarding",
)
# The kubelet's own values for the first six, which it sets once as it starts.
KUBELET_TUNABLES = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}

# Host-wide paths the node's components write outside the folders given to them (the kubelet's
# device-plugin and container-log folders, libcni's result cache, containerd's shim sockets, the
# CRI plugin's network namespaces). Removed at the end only when they did not exist before.
HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/containerd",
    "/run/netns",
    "/opt/containerd",
    "/etc/cni",
    "/opt/cni",
)

# Executables of a node (any process running one is the node's, whoever started it).
NODE_EXECUTABLES = frozenset(
    {
        "kubelet",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
        "containerd",
        "containerd-shim",
        "containerd-shim-runc-v1",
        "containerd-shim-runc-v2",
        "runc",
        "pause",
    }
)

# How the folder of every node starts (tempfile.mkdtemp's prefix).
WORKDIR_PREFIX = "kcp-node-"
CNI_PLUGIN_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
_PROC_SYS = Path("/proc/sys")
_CGROUP_ROOT = Path("/sys/fs/cgroup")


class HostError(RuntimeError):
    """The host could not be prepared for a node or restored after it; the message says why."""


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if check and result.returncode != 0:
        raise HostError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def unavailable_reason() -> str | None:
    """Why this machine cannot run a node, or None when it can. Tests skip with this reason."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, cgroups, a bridge, nft rules)"
    missing = [
        name
        for name in ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "nft", "ip")
        if shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None
    ]
    missing += [f"CNI {p}" for p in CNI_PLUGINS if not (CNI_PLUGIN_DIR / p).is_file()]
    if missing:
        return (
            f"no {', '.join(missing)} on this machine: devenv/node/host-packages.sh installs"
            " containerd, runc, containernetworking-plugins and nftables from Debian's packages"
        )
    hierarchies = cgroup_hierarchies()
    controllers = set()
    for mount in hierarchies:
        if (mount / "cgroup.controllers").is_file():
            controllers.update((mount / "cgroup.controllers").read_text().split())
        else:
            controllers.update(mount.name.split(","))
    lacking = {"cpu", "memory", "pids"} - controllers
    if lacking:
        return f"no cgroup controllers {', '.join(sorted(lacking))} mounted under {_CGROUP_ROOT}"
    return None


def cgroup_hierarchies() -> list[Path]:
    """The mount points of every cgroup hierarchy (v1 controllers, named ones, and v2)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fstype = post.split(" ", 1)[0]
        if fstype in ("cgroup", "cgroup2"):
            found.append(Path(_unescape(pre.split(" ")[4])))
    return sorted(found)


def _unescape(path: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


def read_sysctl(name: str) -> str | None:
    try:
        return (_PROC_SYS / name).read_text().strip()
    except OSError:
        return None


def write_sysctl(name: str, value: str) -> None:
    (_PROC_SYS / name).write_text(value + "\n")


@dataclass(frozen=True)
class HostSnapshot:
    """What a node may change on the host, recorded at one moment."""

    processes: frozenset[str]  # "pid exe argv" of node executables and of pod processes
    mounts: frozenset[str]  # "mount point fstype source"
    sysctls: Mapping[str, str | None]
    cgroups: frozenset[str]  # every cgroup directory, relative to /sys/fs/cgroup
    links: frozenset[str]  # network interface names
    nft_tables: frozenset[str]  # "family name"
    nft_ruleset: str
    paths: frozenset[str]  # the HOST_PATHS that exist
    netns: frozenset[str]  # entries of /run/netns

    def differences(self, after: HostSnapshot) -> list[str]:
        """What changed between this snapshot and `after`, one line per item."""
        lines: list[str] = []
        for name in ("processes", "mounts", "cgroups", "links", "nft_tables", "paths", "netns"):
            before_set: frozenset[str] = getattr(self, name)
            after_set: frozenset[str] = getattr(after, name)
            if name == "cgroups":
                # Other processes make and remove cgroups of their own meanwhile on a shared
                # machine; the node removes only cgroups it made, so one gone is never its doing.
                lines += [f"{name}: new {item}" for item in sorted(self.node_cgroups(after_set))]
                continue
            lines += [f"{name}: gone {item}" for item in sorted(before_set - after_set)]
            lines += [f"{name}: new {item}" for item in sorted(after_set - before_set)]
        for key in sorted(set(self.sysctls) | set(after.sysctls)):
            if self.sysctls.get(key) != after.sysctls.get(key):
                lines.append(f"sysctl {key}: {self.sysctls.get(key)} -> {after.sysctls.get(key)}")
        if self.nft_ruleset != after.nft_ruleset and not any(
            line.startswith("nft_tables") for line in lines
        ):
            lines.append("nft ruleset changed within existing tables")
        return lines

    def node_cgroups(self, now: Iterable[str]) -> set[str]:
        """The cgroups in `now` the node made: new ones whose branch starts new at a hierarchy's
        root, as the kubelet's `kubepods` does. A new cgroup under one that was there before is
        another process's (on these machines the sandbox makes one per command it runs)."""
        # A hierarchy's root is the one directory of it whose parent is not a cgroup.
        roots = {
            c for c in self.cgroups if c == "." or (os.path.dirname(c) or ".") not in self.cgroups
        }
        made = set()
        for rel in set(now) - self.cgroups:
            parent = os.path.dirname(rel) or "."
            while parent not in self.cgroups and parent not in roots and parent != ".":
                parent = os.path.dirname(parent) or "."
            if parent in roots:
                made.add(rel)
        return made

    def to_json(self) -> str:
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, frozenset):
                data[key] = sorted(value)
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str) -> HostSnapshot:
        data = json.loads(text)
        return cls(
            processes=frozenset(data["processes"]),
            mounts=frozenset(data["mounts"]),
            sysctls=dict(data["sysctls"]),
            cgroups=frozenset(data["cgroups"]),
            links=frozenset(data["links"]),
            nft_tables=frozenset(data["nft_tables"]),
            nft_ruleset=data["nft_ruleset"],
            paths=frozenset(data["paths"]),
            netns=frozenset(data["netns"]),
        )


def _mounts() -> list[tuple[str, str, str]]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fields = post.split(" ")
        found.append(
            (_unescape(pre.split(" ")[4]), fields[0], fields[1] if len(fields) > 1 else "")
        )
    return found


def _cgroup_dirs() -> set[str]:
    found: set[str] = set()
    for mount in cgroup_hierarchies():
        for dirpath, _dirnames, _files in os.walk(mount):
            found.add(os.path.relpath(dirpath, _CGROUP_ROOT))
    return found


@dataclass(frozen=True)
class _Proc:
    pid: int
    exe: str
    argv: list[str] = field(default_factory=list)
    cgroup: str = ""


def _processes() -> Iterator[_Proc]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue
        if not argv:
            continue  # a kernel thread
        words = [a.decode(errors="replace") for a in argv]
        yield _Proc(int(entry.name), os.path.basename(words[0]), words, cgroup)


def _is_node_process(proc: _Proc) -> bool:
    return (
        proc.exe in NODE_EXECUTABLES
        or "/kubepods" in proc.cgroup
        # The node cluster's etcd and kube-apiserver, by their folder (devenv.node.node).
        or any(f"/{WORKDIR_PREFIX}" in a for a in proc.argv)
    )


def _nft(*args: str) -> str:
    return _run(["nft", *args]).stdout


def nft_tables() -> set[str]:
    tables = set()
    for line in _nft("list", "tables").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "table":
            tables.add(f"{parts[1]} {parts[2]}")
    return tables


def snapshot() -> HostSnapshot:
    """The host's state as far as a node touches it."""
    netns_dir = Path("/run/netns")
    return HostSnapshot(
        processes=frozenset(
            f"{p.pid} {' '.join(p.argv)}" for p in _processes() if _is_node_process(p)
        ),
        mounts=frozenset(" ".join(m) for m in _mounts()),
        sysctls={name: read_sysctl(name) for name in NODE_SYSCTLS},
        cgroups=frozenset(_cgroup_dirs()),
        links=frozenset(p.name for p in Path("/sys/class/net").iterdir()),
        nft_tables=frozenset(nft_tables()),
        nft_ruleset=_nft("list", "ruleset"),
        paths=frozenset(p for p in HOST_PATHS if os.path.lexists(p)),
        netns=frozenset(p.name for p in netns_dir.iterdir()) if netns_dir.is_dir() else frozenset(),
    )


# -- undoing a node ---------------------------------------------------------------------------


def kill_node_processes(before: HostSnapshot, markers: Iterable[str]) -> list[str]:
    """SIGKILLs every process that is a node's and was not running before: pod processes (in a
    kubepods cgroup) and those whose argv names one of `markers` (the node's folder, its
    containerd socket: the daemons, etcd, kube-apiserver and the shims). Returns what it
    killed."""
    known = {int(line.split(" ", 1)[0]) for line in before.processes}
    markers = tuple(markers)
    killed = []
    for proc in _processes():
        if proc.pid in known or proc.pid == os.getpid():
            continue
        in_pod = "/kubepods" in proc.cgroup
        named = any(m in a for a in proc.argv for m in markers)
        if in_pod or named:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
                killed.append(f"{proc.pid} {' '.join(proc.argv)[:120]}")
    return killed


def unmount_new(before: HostSnapshot, under: Iterable[str]) -> list[str]:
    """Unmounts (lazily, deepest first) every mount that is new since `before` and lies under one
    of `under`. Repeats until none is left: a propagated mount may show up twice."""
    prefixes = tuple(p.rstrip("/") + "/" for p in under)
    unmounted: list[str] = []
    for _ in range(5):
        targets = sorted(
            {
                point
                for point, fstype, source in _mounts()
                if f"{point} {fstype} {source}" not in before.mounts
                and (point + "/").startswith(prefixes)
            },
            key=lambda p: p.count("/"),
            reverse=True,
        )
        if not targets:
            break
        for point in targets:
            if _run(["umount", "-l", point], check=False).returncode == 0:
                unmounted.append(point)
    return unmounted


def remove_new_cgroups(before: HostSnapshot, timeout: float = 10.0) -> list[str]:
    """Removes the cgroups created since `before`, deepest first (a cgroup with processes cannot
    go: it is retried until `timeout`, while killed processes exit)."""
    deadline = time.monotonic() + timeout
    while True:
        made = before.node_cgroups(_cgroup_dirs())
        left = sorted(made, key=lambda p: p.count("/"), reverse=True)
        failed = []
        for rel in left:
            try:
                (_CGROUP_ROOT / rel).rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                failed.append(f"{rel}: {exc.strerror}")
        if not failed or time.monotonic() > deadline:
            return failed
        time.sleep(0.2)


def remove_new_nft_tables(before: HostSnapshot) -> list[str]:
    removed = []
    for table in sorted(nft_tables() - before.nft_tables):
        family, name = table.split(" ")
        _run(["nft", "delete", "table", family, name], check=False)
        removed.append(table)
    return removed


def remove_new_links(before: HostSnapshot, names: Iterable[str]) -> list[str]:
    """Deletes the named links, and veths attached to them, that did not exist before."""
    names = set(names)
    removed = []
    net = Path("/sys/class/net")
    for link in sorted(p.name for p in net.iterdir()):
        if link in before.links:
            continue
        master = net / link / "master"
        attached = master.exists() and os.path.basename(os.readlink(master)) in names
        if link in names or attached:
            _run(["ip", "link", "delete", link], check=False)
            removed.append(link)
    return removed


def remove_new_netns(before: HostSnapshot) -> list[str]:
    netns_dir = Path("/run/netns")
    if not netns_dir.is_dir():
        return []
    removed = []
    for entry in sorted(netns_dir.iterdir()):
        if entry.name not in before.netns:
            _run(["umount", "-l", str(entry)], check=False)
            with contextlib.suppress(OSError):
                entry.unlink()
            removed.append(entry.name)
    return removed


def restore_sysctls(before: HostSnapshot) -> list[str]:
    restored = []
    for name, value in before.sysctls.items():
        if value is not None and read_sysctl(name) != value:
            write_sysctl(name, value)
            restored.append(f"{name}={value}")
    return restored


def remove_new_paths(before: HostSnapshot) -> list[str]:
    removed = []
    for path in HOST_PATHS:
        if path not in before.paths and os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def restore(
    before: HostSnapshot, *, workdir: Path, markers: Iterable[str], bridge: str
) -> list[str]:
    """Undoes what a node left on the host, judged against the snapshot taken before it started:
    its processes, mounts, network namespaces, links, nft tables, cgroups, sysctls and host paths.
    Returns one line per thing undone; raises HostError naming what could not be."""
    done = [f"killed {p}" for p in kill_node_processes(before, [str(workdir), *markers])]
    if done:
        time.sleep(0.3)
    under = [str(workdir), *HOST_PATHS]
    done += [f"unmounted {m}" for m in unmount_new(before, under)]
    done += [f"removed netns {n}" for n in remove_new_netns(before)]
    done += [f"deleted link {n}" for n in remove_new_links(before, [bridge])]
    done += [f"deleted nft table {t}" for t in remove_new_nft_tables(before)]
    failed = remove_new_cgroups(before)
    done += [f"restored {s}" for s in restore_sysctls(before)]
    done += [f"removed {p}" for p in remove_new_paths(before)]
    if failed:
        raise HostError("cgroups the node made could not be removed: " + "; ".join(failed))
    return done
