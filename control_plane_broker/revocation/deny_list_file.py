"""The xfcc deny list file (`BROKER_XFCC_DENY_LIST_FILE`), kept current while the broker runs.

Holds: the file is looked at (one `stat`) at most once per `check_every` seconds, and read again
only when its modification time, size or inode changed (a mounted ConfigMap is replaced by a new
file, not rewritten); a line that is not a hash is logged by number and ignored; a file that
cannot be read any more keeps the last list in force (logged), so a broken mount never lifts a
revocation. The first read happens at start: an unreadable file stops the broker there.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from control_plane_broker.revocation.revocation_rules import DenyList, parse_deny_list

log = logging.getLogger(__name__)

CHECK_EVERY_SECONDS = 1.0


class DenyListFile:
    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float] = time.monotonic,
        check_every: float = CHECK_EVERY_SECONDS,
    ) -> None:
        self._path = path
        self._clock = clock
        self._check_every = check_every
        self._signature = self._stat()
        self._list = self._read()
        self._checked_at = clock()

    def _stat(self) -> tuple[int, int, int]:
        st = os.stat(self._path)
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _read(self) -> DenyList:
        parsed = parse_deny_list(self._path.read_text(encoding="utf-8", errors="replace"))
        if parsed.bad_lines:
            log.warning(
                "deny list lines ignored: not a SHA-256 hash",
                extra={"file": str(self._path), "lines": list(parsed.bad_lines[:20])},
            )
        log.info("deny list read", extra={"file": str(self._path), "hashes": len(parsed.hashes)})
        return parsed

    def hashes(self) -> frozenset[str]:
        now = self._clock()
        if now - self._checked_at >= self._check_every:
            self._checked_at = now
            self._refresh()
        return self._list.hashes

    def _refresh(self) -> None:
        try:
            signature = self._stat()
            if signature != self._signature:
                self._list = self._read()
                self._signature = signature
        except OSError as exc:
            log.warning(
                "deny list unreadable; the last one read stays in force",
                extra={"file": str(self._path), "error": type(exc).__name__},
            )
