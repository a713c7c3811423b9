"""Running the build scripts of the real Compass parts (build.sh, build-connector.sh): where
their source is, and a build with its progress on our stderr as it happens (the first build
takes minutes). Each script prints the folder it built on stdout, its progress on stderr, and
its last stderr line says why it failed (exit 3: a source is not here)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

EXIT_NO_SOURCE = 3  # the script's exit when a source cannot be had
_SCRIPT_PREFIX = re.compile(r"^real-(director|connector): ")


@dataclass(frozen=True)
class Built:
    code: int  # the script's exit status
    folder: str  # what it printed on stdout: the folder it built ("" when it failed)
    reason: str  # its last stderr line, without the script's name


def find_source(script: Path) -> tuple[Path | None, str]:
    """(where the source or the finished build is, "") or (None, why not), building nothing."""
    result = subprocess.run(
        ["bash", str(script), "--find-source"], capture_output=True, text=True, check=False
    )
    if result.returncode == 0 and result.stdout.strip():
        return Path(result.stdout.strip()), ""
    last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    return None, _SCRIPT_PREFIX.sub("", last) or (
        f"{script} --find-source failed ({result.returncode})"
    )


def build(script: Path) -> Built:
    with subprocess.Popen(
        ["bash", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: interrupted, `go build` goes too
    ) as proc:
        assert proc.stderr is not None
        assert proc.stdout is not None
        last = ""
        try:
            for line in proc.stderr:
                sys.stderr.write(line)
                if line.strip():
                    last = line.strip()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            raise
        out = proc.stdout.read().strip()
        code = proc.wait()
    return Built(code=code, folder=out, reason=_SCRIPT_PREFIX.sub("", last))
