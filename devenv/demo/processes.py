"""The processes the demo starts itself (simulator, broker, agents, runtime agents).

Holds: every child runs in a session of its own, so a Ctrl-C in the terminal reaches only the
demo, which then stops the children (SIGTERM, then SIGKILL after a grace period); a child's
stdout and stderr go to `<workdir>/logs/<name>.log`; its pid and command are listed in
`<workdir>/processes.json` as soon as it starts, so leftovers can be found by anyone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devenv.clusters import terminate

_STOP_GRACE_SECONDS = 10.0


class ChildDied(RuntimeError):
    """A child process exited while the demo still needed it."""


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects among a log file's lines (other lines are skipped)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict):
                yield entry


class Processes:
    def __init__(self, workdir: Path) -> None:
        self.log_dir = workdir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._registry = workdir / "processes.json"
        self._children: list[Child] = []
        self._noted: list[dict[str, Any]] = []  # started by others for the demo: listed only

    @property
    def children(self) -> list[Child]:
        return list(self._children)

    def start(self, name: str, argv: Sequence[str], *, env: Mapping[str, str]) -> Child:
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        child = Child(name=name, argv=list(argv), log_path=log_path, popen=popen)
        self._children.append(child)
        self._write_registry()
        return child

    def adopt(self, name: str, popen: subprocess.Popen[bytes], log_path: Path) -> Child:
        """A child someone else started for the demo (e.g. the real compass-runtime-agent):
        listed, watched by `check_alive` and stopped by `stop_all` like our own."""
        argv = [str(a) for a in popen.args] if isinstance(popen.args, list) else [str(popen.args)]
        child = Child(name=name, argv=argv, log_path=log_path, popen=popen)
        self._children.append(child)
        self._write_registry()
        return child

    def note(self, name: str, pid: int) -> None:
        """A process that is not our child but runs for the demo (e.g. the real Director,
        stopped by its own stack): listed in processes.json, so leftovers can be found."""
        try:
            argv = [
                a.decode(errors="replace")
                for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
            ]
        except OSError:
            argv = []
        self._noted.append({"name": name, "pid": pid, "argv": argv, "managed": False})
        self._write_registry()

    def _write_registry(self) -> None:
        entries = [{"name": c.name, "pid": c.pid, "argv": c.argv} for c in self._children]
        self._registry.write_text(json.dumps(entries + self._noted, indent=2))

    def check_alive(self) -> None:
        """Raises `ChildDied` with the log's tail when a child has exited."""
        for child in self._children:
            code = child.popen.poll()
            if code is not None:
                raise ChildDied(
                    f"{child.name} exited with code {code}; last lines of {child.log_path}:\n"
                    f"{log_tail(child.log_path)}"
                )

    def stop(self, child: Child) -> None:
        """One child stopped on purpose (as a kubelet stops the pod of a deleted Deployment):
        no longer watched by `check_alive`, still listed in processes.json."""
        self._children.remove(child)
        terminate(child.popen, timeout=_STOP_GRACE_SECONDS)

    def stop_all(self) -> None:
        """SIGTERM to every child at once, then each awaited; SIGKILL to a child's process group
        once the grace period is over. Stopping them together keeps Ctrl-C quick."""
        for child in reversed(self._children):
            if child.alive:
                with contextlib.suppress(ProcessLookupError):
                    child.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_SECONDS
        for child in reversed(self._children):
            try:
                child.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.popen.wait(_STOP_GRACE_SECONDS)
        self._children.clear()


def wait_for_json_line(
    child: Child,
    match: Callable[[dict[str, Any]], bool],
    *,
    timeout: float,
) -> dict[str, Any]:
    """The first JSON log line of `child` that `match`es; fails early when the child dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in json_lines(child.log_path):
            if match(entry):
                return entry
        if not child.alive:
            raise ChildDied(
                f"{child.name} exited with code {child.popen.returncode}; last lines of "
                f"{child.log_path}:\n{log_tail(child.log_path)}"
            )
        time.sleep(0.1)
    raise TimeoutError(f"{child.name} did not report within {timeout:.0f}s")
