"""Faults of Director's database: its sessions cut, as a failover or a restarted pooler cuts them.

`SessionCutter` ends every session on Director's database at a fixed interval, from a thread of
its own, until its time is up or it is stopped. Each round is one `pg_terminate_backend` over
`pg_stat_activity` in a session of its own, which it spares (`pid <> pg_backend_pid()`), and it
spares the harness's own psql sessions (`postgres.HARNESS_APPLICATION`): the test's judge is not
the system under test. Director's pool (Go's database/sql) finds its connections dead and opens
new ones; a statement or transaction in flight on a cut session fails.
"""

from __future__ import annotations

import subprocess
import threading
import time
from types import TracebackType
from typing import Self

from .postgres import Postgres, PostgresError


class SessionCutter:
    """Cuts Director's sessions every `every` seconds for `for_seconds`, from a thread.

    `start()` begins (the first round at once); `wait()` returns once the time is up; `stop()`
    ends it early; both join the thread, so none is left behind. `rounds`, `terminated` (sessions
    ended, summed) and `errors` (rounds that failed, e.g. while the server was down) say what it
    did. As a context manager it starts on entry and stops on exit.
    """

    def __init__(
        self, database: Postgres, *, every: float = 0.5, for_seconds: float = 20.0
    ) -> None:
        if every <= 0:
            raise ValueError(f"every must be > 0, not {every}")
        if for_seconds < 0:
            raise ValueError(f"for_seconds must be >= 0, not {for_seconds}")
        self._database = database
        self.every = every
        self.for_seconds = for_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.rounds = 0
        self.terminated = 0
        self.errors: list[str] = []

    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError("the session cutter was started already")
        self._thread = threading.Thread(
            target=self._run, name="real-director-session-cutter", daemon=True
        )
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for the cutting to end by itself; True when it has ended."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        """Ends the cutting now (after the round in flight, if any) and joins the thread."""
        self._stop.set()
        if not self.wait(timeout):
            raise RuntimeError(f"the session cutter did not stop within {timeout}s")

    def _run(self) -> None:
        ends = time.monotonic() + self.for_seconds
        next_round = time.monotonic()
        while not self._stop.is_set() and time.monotonic() < ends:
            try:
                ended = self._database.terminate_sessions()
            # A failed round (e.g. the server itself is down) is counted; cutting goes on.
            except (PostgresError, OSError, subprocess.SubprocessError) as exc:
                with self._lock:
                    self.rounds += 1
                    self.errors.append(str(exc))
            else:
                with self._lock:
                    self.rounds += 1
                    self.terminated += ended
            # A slow round delays the next one; no burst of rounds to catch up.
            next_round = max(next_round + self.every, time.monotonic())
            self._stop.wait(max(0.0, min(next_round, ends) - time.monotonic()))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
