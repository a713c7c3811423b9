"""`RealCompass`: the real Compass Director with everything it needs, as one object.

    PostgreSQL (migrated) ── Director ── gateway (token endpoint, JWT, JWKS, lost answers)
                               │
                     a test kube-apiserver (ConfigMap, Secrets)

`start_real_compass()` builds what is missing (devenv/real_director/build.sh), starts the parts
in order and returns once Director answers `/readyz` behind the gateway; `stop()` (or leaving
the `with` block) stops everything it started, also when the start itself failed half-way.
What it needs and how long it takes: docs/real-compass.md.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from devenv.clusters import Binaries, TestCluster, find_binaries, start_cluster

from . import affinity, build_scripts, postgres
from . import connector as real_connector_module
from .connector import ConnectorUnavailable, RealConnector, ReservedPorts
from .db_faults import SessionCutter
from .director import DirectorConfig, DirectorProcess, local_configuration, start_director
from .gateway import (
    CONNECTOR_PATH,
    GRAPHQL_PATH,
    JWKS_PATH,
    TOKEN_PATH,
    DirectorTokens,
    DownMode,
    Gateway,
    LossMode,
    new_client_credentials,
)

BUILD_SCRIPT = Path(__file__).resolve().parent / "build.sh"
PROVIDER = "kyma-compass-pull devenv"

_running: weakref.WeakSet[RealCompass] = weakref.WeakSet()


class RealCompassError(RuntimeError):
    """The stack could not be built or started; the message says why."""


class CompassSourceMissing(RealCompassError):
    """The pinned Compass source is nowhere to be found; the message says where we looked."""


def find_compass_source() -> tuple[Path | None, str]:
    """(where the source or the finished build is, "") or (None, why not), building nothing."""
    return build_scripts.find_source(BUILD_SCRIPT)


def build_director() -> Path:
    """The folder holding `director` and its `compass/` source tree, built once per commit.

    Progress goes to our stderr as it happens (the first build takes minutes).
    """
    built = build_scripts.build(BUILD_SCRIPT)
    if built.code == build_scripts.EXIT_NO_SOURCE:
        raise CompassSourceMissing(built.reason)
    if built.code != 0 or not built.folder:
        raise RealCompassError(f"{BUILD_SCRIPT} failed (exit {built.code}): {built.reason}")
    return Path(built.folder)


class RealCompass:
    """A running stack. Attributes are what a client needs; methods are what a test needs."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.gateway_url = ""
        self.director_url = ""  # what BROKER_DIRECTOR_URL takes: the gateway's GraphQL path
        self.token_url = ""
        self.jwks_url = ""
        self.client_id, self.client_secret = new_client_credentials()
        self.connector_url = ""
        self.namespace = f"compass-director-{uuid.uuid4().hex[:6]}"
        self.timings: dict[str, float] = {}  # seconds per start phase, for docs and benches
        self.director_process: DirectorProcess | None = None
        self.database: postgres.Postgres | None = None
        self.cluster: TestCluster | None = None
        self._own_cluster = False
        self._gateway: Gateway | None = None
        self._database_stopped = False  # on purpose (`stop_database`), not died
        self._cutters: list[SessionCutter] = []
        # The real Connector, hydrator and Oathkeeper, when started with `real_connector`.
        self.real_connector: RealConnector | None = None

    # -- what clients need -----------------------------------------------------------------

    @property
    def gateway(self) -> Gateway:
        if self._gateway is None:
            raise RuntimeError("the stack is not running")
        return self._gateway

    @property
    def director_log(self) -> Path:
        return self.workdir / "director.log"

    def write_credentials_file(self, path: Path) -> Path:
        """compass-manager's credentials file, as the broker's BROKER_DIRECTOR_CREDENTIALS_FILE
        reads it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "data": {
                "client_id": self.client_id,
                "client_secret": self.client_secret,
                "tokens_endpoint": self.token_url,
            }
        }
        path.write_text(yaml.safe_dump(doc))
        path.chmod(0o600)
        return path

    def endpoints(self) -> dict[str, Any]:
        return {
            "gateway_url": self.gateway_url,
            "director_url": self.director_url,
            "token_url": self.token_url,
            "jwks_url": self.jwks_url,
            "client_id": self.client_id,
            "client_secret": self.client_secret,
            "connector_url": self.connector_url,
            "admin_url": f"{self.gateway_url}/_gateway",
            "director_internal_url": self.director_process.url if self.director_process else "",
            "postgres": f"postgresql://postgres@127.0.0.1:{self.database.port}/compass"
            if self.database
            else "",
            "director_log": str(self.director_log),
            **(
                {
                    "oathkeeper_url": self.real_connector.oathkeeper_url,
                    "certificate_secured_url": self.real_connector.certificate_secured_url,
                    "connector_logs": str(self.real_connector.workdir),
                }
                if self.real_connector is not None
                else {}
            ),
            "workdir": str(self.workdir),
            "pids": self.pids(),
        }

    # -- tenants ---------------------------------------------------------------------------

    def _db(self) -> postgres.Postgres:
        if self.database is None:
            raise RuntimeError("the stack is not running")
        return self.database

    def tenant_id(self, external_id: str) -> str | None:
        """The internal ID of a tenant, or None when Director does not know it."""
        return _resolve(self._db(), external_id)

    def _add_tenant(self, external_id: str, kind: str) -> str:
        existing = self.tenant_id(external_id)
        if existing is not None:
            return existing
        rows = self._db().query(
            "INSERT INTO business_tenant_mappings "
            "(id, external_name, external_tenant, provider_name, type, status) VALUES "
            "(gen_random_uuid(), :'ext', :'ext', :'provider', :'kind', 'Active') RETURNING id",
            {"ext": external_id, "provider": PROVIDER, "kind": kind},
        )
        internal = rows[0][0]
        self.gateway.remember_tenant(external_id, internal)
        return internal

    def add_global_account(self, external_id: str) -> str:
        """A global account (type `account`), as the tenant fetcher would sync it; returns its
        internal ID. Adding one that exists is a no-op."""
        return self._add_tenant(external_id, "account")

    def add_subaccount(self, external_id: str, *, parent: str, region: str | None = None) -> str:
        """A subaccount of the global account `parent` (external ID, added first).

        `region` becomes the subaccount's `region` label, which Director copies onto every
        runtime an integration system registers for it (else it writes "")."""
        parent_id = self.tenant_id(parent)
        if parent_id is None:
            raise ValueError(f"parent {parent!r} is not a tenant: add_global_account it first")
        internal = self._add_tenant(external_id, "subaccount")
        params = {"id": internal, "parent": parent_id}
        self._db().psql(
            "INSERT INTO tenant_parents (tenant_id, parent_id) VALUES (:'id', :'parent') "
            "ON CONFLICT DO NOTHING;",
            params,
        )
        if region is not None:
            # A tenant's own label: no object ID, only the tenant's.
            self._db().psql(
                "DELETE FROM labels WHERE tenant_id = :'id' AND key = 'region' "
                "AND runtime_id IS NULL AND app_id IS NULL AND runtime_context_id IS NULL;"
                "INSERT INTO labels (id, tenant_id, key, value) VALUES "
                "(gen_random_uuid(), :'id', 'region', to_jsonb(:'region'::text));",
                {**params, "region": region},
            )
        return internal

    def add_tenants(self, subaccounts: Mapping[str, str]) -> None:
        """Many subaccounts (external ID -> its global account's) and their global accounts at
        once, in one psql run, as the tenant fetcher would sync them: for fleets, where
        `add_subaccount` one by one costs seconds. Tenants that exist are left as they are."""
        if not subaccounts:
            return
        rows = self._db().query(
            "WITH pairs AS (SELECT s, g FROM unnest(string_to_array(:'subs', ','), "
            "string_to_array(:'parents', ',')) AS x(s, g)), "
            "accounts AS (INSERT INTO business_tenant_mappings "
            "(id, external_name, external_tenant, provider_name, type, status) "
            "SELECT gen_random_uuid(), g, g, :'provider', 'account', 'Active' "
            "FROM (SELECT DISTINCT g FROM pairs) d WHERE NOT EXISTS (SELECT 1 FROM "
            "business_tenant_mappings t WHERE t.external_tenant = d.g) "
            "RETURNING id, external_tenant), "
            "every_account AS (SELECT id, external_tenant FROM accounts UNION ALL "
            "SELECT t.id, t.external_tenant FROM business_tenant_mappings t "
            "WHERE t.external_tenant IN (SELECT g FROM pairs)), "
            "subs AS (INSERT INTO business_tenant_mappings "
            "(id, external_name, external_tenant, provider_name, type, status) "
            "SELECT gen_random_uuid(), s, s, :'provider', 'subaccount', 'Active' "
            "FROM pairs WHERE NOT EXISTS (SELECT 1 FROM business_tenant_mappings t "
            "WHERE t.external_tenant = pairs.s) RETURNING id, external_tenant), "
            "parents AS (INSERT INTO tenant_parents (tenant_id, parent_id) "
            "SELECT subs.id, a.id FROM subs JOIN pairs ON pairs.s = subs.external_tenant "
            "JOIN every_account a ON a.external_tenant = pairs.g ON CONFLICT DO NOTHING) "
            "SELECT external_tenant, id FROM every_account UNION ALL "
            "SELECT external_tenant, id FROM subs",
            {
                "subs": ",".join(subaccounts),
                "parents": ",".join(subaccounts.values()),
                "provider": PROVIDER,
            },
        )
        for external, internal in rows:
            self.gateway.remember_tenant(external, internal)

    # -- Director's database: the judge ----------------------------------------------------

    def query(self, sql: str, **params: str) -> list[tuple[str, ...]]:
        """Rows of `sql` run on Director's database, every value as text (NULL as "").

        `params` are psql variables: write `:'name'` in `sql` for the quoted value."""
        return self._db().query(sql, params)

    def runtimes(
        self, *, label_key: str | None = None, label_value: str | None = None
    ) -> list[dict[str, Any]]:
        """Registered runtimes as Director stores them: `id`, `name`, `labels` (decoded JSON),
        optionally only those with a label (and value)."""
        rows = self.query(
            "SELECT r.id, r.name, COALESCE((SELECT jsonb_object_agg(l.key, l.value) "
            "FROM labels l WHERE l.runtime_id = r.id), '{}'::jsonb) FROM runtimes r "
            "WHERE :'by_key' = 'no' OR r.id IN (SELECT l.runtime_id FROM labels l WHERE "
            "l.key = :'key' AND (:'by_value' = 'no' OR l.value = to_jsonb(:'value'::text))) "
            "ORDER BY r.name, r.id",
            by_key="no" if label_key is None else "yes",
            key=label_key or "",
            by_value="no" if label_value is None else "yes",
            value=label_value or "",
        )
        return [
            {"id": rid, "name": name, "labels": json.loads(labels)} for rid, name, labels in rows
        ]

    def runtime_count(self, *, label_key: str | None = None, label_value: str | None = None) -> int:
        return len(self.runtimes(label_key=label_key, label_value=label_value))

    def runtime_tenants(self, runtime_id: str) -> dict[str, bool]:
        """The tenants (external IDs) with access to a runtime, each with whether it owns it."""
        rows = self.query(
            "SELECT t.external_tenant, tr.owner FROM tenant_runtimes tr "
            "JOIN business_tenant_mappings t ON t.id = tr.tenant_id WHERE tr.id = :'id'",
            id=runtime_id,
        )
        return {external: owner == "t" for external, owner in rows}

    # -- faults and counters ---------------------------------------------------------------

    def lose_answers(
        self,
        operation: str,
        *,
        ratio: float = 1.0,
        count: int | None = None,
        mode: LossMode = "504",
    ) -> None:
        """Director acts on matching calls; their callers see 504 (or a dropped connection)."""
        self.gateway.lose_answers(operation, ratio=ratio, count=count, mode=mode)

    def clear_faults(self) -> None:
        self.gateway.clear_faults()

    def calls(self, tenant: str | None = None) -> dict[str, int]:
        """GraphQL calls the gateway passed to Director, per top-level field and operation;
        with `tenant` (an external ID), only those sent for it."""
        return self.gateway.calls(tenant)

    def set_down(self, mode: DownMode) -> None:
        """Compass unavailable (503, dropped or refused connections) until `clear_down()`;
        Director keeps running behind the gateway."""
        self.gateway.set_down(mode)

    def clear_down(self) -> None:
        self.gateway.clear_down()

    def listening(self) -> bool:
        return self.gateway.listening()

    def refuse_credentials(self, status: int = 401) -> None:
        """The token endpoint refuses the client's credentials (`status`, `invalid_client`) and
        every access token issued so far is revoked (Director's front door answers it 401),
        until `accept_credentials()`: a rotated or deleted client secret."""
        self.gateway.refuse_credentials(status)

    def accept_credentials(self) -> None:
        """The same credentials get tokens again (a rotated secret put back)."""
        self.gateway.accept_credentials()

    def set_latency(self, seconds_min: float | None, seconds_max: float | None = None) -> None:
        """A slow Director: each GraphQL call waits a uniform random time in
        [`seconds_min`, `seconds_max`] before the gateway passes it on; None clears it."""
        self.gateway.set_latency(seconds_min, seconds_max)

    # -- faults of Director's database -----------------------------------------------------

    def stop_database(self) -> None:
        """Stops PostgreSQL (a fast shutdown: sessions cut off) and leaves Director running;
        `start_database()` starts it again on the same data and port."""
        self._db().shut_down()
        self._database_stopped = True

    def start_database(self) -> None:
        """Starts PostgreSQL again after `stop_database()`; Director's pool reconnects by
        itself on its next statements."""
        self._db().start_again()
        self._database_stopped = False

    @contextlib.contextmanager
    def database_stopped(self) -> Iterator[None]:
        """PostgreSQL stopped for the `with` block, started again when it ends (also on an
        error)."""
        self.stop_database()
        try:
            yield
        finally:
            self.start_database()

    def cut_sessions(self, *, every: float = 0.5, for_seconds: float = 20.0) -> SessionCutter:
        """Starts ending Director's database sessions every `every` seconds for `for_seconds`
        (a failover, a restarted pooler), from a thread; returns it, started: `wait()` for it
        to end, `stop()` it early. `stop()` of the stack stops it too."""
        cutter = SessionCutter(self._db(), every=every, for_seconds=for_seconds)
        self._cutters = [c for c in self._cutters if c.running] + [cutter]
        return cutter.start()

    def start_certificate_secured(self) -> str:
        """Serves the certificate-secured Connector and Director (mutual TLS with the
        certificates the gateway's Connector issues), whose URLs `configuration` then hands
        out: what compass-runtime-agent syncs with after `Connected`. Returns its base URL.
        (The real Connector's certificate-secured side is `real_connector.front`, from the
        start.)"""
        self.gateway.start_certificate_secured()
        side = self.gateway.certificate_secured_side
        assert side is not None
        return side.url

    def connector_exchanges(self, runtime_id: str) -> int:
        """Tokens of this runtime spent at the Connector (one-time, then CSR): at the real one,
        the tokens the hydrator resolved (its log) of this runtime's SystemAuths; else at the
        gateway's."""
        if self.real_connector is not None:
            resolved = self.real_connector.resolved_tokens()
            if not resolved:
                return 0
            ours = {
                row[0]
                for row in self.query(
                    "SELECT id FROM system_auths WHERE runtime_id::text = :'id'", id=runtime_id
                )
            }
            return sum(1 for auth in resolved if auth in ours)
        connector = self.gateway.connector
        return connector.spent(runtime_id) if connector is not None else 0

    def tenant_runtimes(self, external_tenant: str) -> list[dict[str, str]]:
        """Runtimes a tenant (external ID) has access to in Director's database: `id`, `name`,
        and `owner` ("yes" for the tenant that owns it)."""
        rows = self.query(
            "SELECT r.id, r.name, CASE WHEN tr.owner THEN 'yes' ELSE 'no' END FROM runtimes r "
            "JOIN tenant_runtimes tr ON tr.id = r.id "
            "JOIN business_tenant_mappings t ON t.id = tr.tenant_id "
            "WHERE t.external_tenant = :'ext' ORDER BY r.name, r.id",
            ext=external_tenant,
        )
        return [{"id": rid, "name": name, "owner": owner} for rid, name, owner in rows]

    def lost(self) -> dict[str, int]:
        return self.gateway.lost()

    def reset_calls(self) -> None:
        self.gateway.reset_calls()

    def access_token(self) -> str:
        """A valid bearer for `director_url`, without the round trip to the token endpoint."""
        return self.gateway.issue_token()

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return (
            self._gateway is not None
            and self.director_process is not None
            and self.director_process.running
            and self.database is not None
            and (self.database.running or self._database_stopped)
            and (self.real_connector is None or self.real_connector.running)
        )

    def pids(self) -> dict[str, int]:
        """Process IDs of what this stack started (for checks that nothing survives stop)."""
        found: dict[str, int] = {}
        if self.director_process is not None and self.director_process.pid is not None:
            found["director"] = self.director_process.pid
        if self.database is not None and self.database.pid is not None:
            found["postgres"] = self.database.pid
        if self.real_connector is not None:
            found.update(self.real_connector.pids())
        if self._own_cluster and self.cluster is not None:
            for index, proc in enumerate(self.cluster._processes):
                found[("etcd", "kube-apiserver")[index] if index < 2 else f"p{index}"] = proc.pid
        return found

    def stop(self) -> None:
        """Stops what was started, callers first: the real Connector's parts, gateway, Director,
        database, cluster."""
        errors: list[BaseException] = []
        steps = [
            *(cutter.stop for cutter in self._cutters),
            lambda: self.real_connector.stop() if self.real_connector is not None else None,
            lambda: self._gateway.stop_certificate_secured() if self._gateway is not None else None,
            lambda: self._gateway.stop() if self._gateway is not None else None,
            lambda: self.director_process.stop() if self.director_process is not None else None,
            lambda: self.database.stop() if self.database is not None else None,
            lambda: self.cluster.stop() if self._own_cluster and self.cluster is not None else None,
        ]
        for step in steps:
            try:
                step()
            except Exception as exc:  # every part gets its turn, whatever the others do
                errors.append(exc)
        _running.discard(self)
        if errors:
            raise RealCompassError(f"stopping the stack: {errors!r}")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_real_compass(
    workdir: Path,
    *,
    binaries: Binaries | None = None,
    cluster: TestCluster | None = None,
    connector_url: str | None = None,
    director_folder: Path | None = None,
    cpus: Iterable[int] | None = None,
    real_connector: bool = False,
    connector_folder: Path | None = None,
) -> RealCompass:
    """Builds what is missing and starts the stack in `workdir` (logs, config, kubeconfig).

    `cluster`: an API server to put Director's ConfigMap and Secrets on (in a namespace of
    their own); without it a cluster is started from `binaries` (built when None) and stopped
    with the stack. `connector_url`: what Director returns as the one-time token's
    `connectorURL` (default: the gateway's own Connector, `/connector/graphql`).
    `director_folder`: the output of build.sh when the caller already ran it. `cpus`: the CPU
    numbers PostgreSQL, Director and the gateway's thread run on (default: wherever the caller
    runs; devenv/real_director/affinity.py), e.g. to keep a benchmark's other processes off them.

    `real_connector`: the real Connector, hydrator and Oathkeeper, with the front for the
    certificate-secured side (devenv/real_director/connector.py), built when missing
    (`connector_folder`: build-connector.sh's output, when the caller ran it). One-time tokens
    then name Oathkeeper's `/connector/graphql` as their `connectorURL` unless `connector_url`
    says otherwise. Needs root and unshare(1): ConnectorUnavailable says why not.

    Raises CompassSourceMissing when the source cannot be had, ConnectorUnavailable when the real
    Connector cannot run here, RealCompassError otherwise.
    """
    pin = affinity.checked(cpus)
    reserved: ReservedPorts | None = None
    if real_connector:
        reason = real_connector_module.why_not_here()
        if reason is not None:
            raise ConnectorUnavailable(reason)
        connector_folder = connector_folder or real_connector_module.build_connector()
        reserved = ReservedPorts()
        connector_url = connector_url or real_connector_module.connector_url(reserved.ports)
    workdir.mkdir(parents=True, exist_ok=True)
    folder = director_folder or build_director()
    source = folder / "compass"
    migrations_dir = source / "components/schema-migrator/migrations/director"
    stack = RealCompass(workdir)
    _running.add(stack)
    try:
        began = time.monotonic()
        template = postgres.migrated_template(migrations_dir, folder, log_dir=workdir)
        stack.timings["migrated_template"] = time.monotonic() - began
        phase = time.monotonic()
        stack.database = affinity.started_on(
            pin, postgres.start_postgres, template, workdir / "postgres.log"
        )
        stack.timings["postgres"] = time.monotonic() - phase

        phase = time.monotonic()
        if cluster is None:
            stack._own_cluster = True
            stack.cluster = start_cluster(
                "compass-director", binaries or find_binaries(), workdir=workdir / "cluster"
            )
        else:
            stack.cluster = cluster
        stack.timings["cluster"] = time.monotonic() - phase

        database = stack.database
        gateway = Gateway(
            client_id=stack.client_id,
            client_secret=stack.client_secret,
            resolve_tenant=lambda external: _resolve(database, external),
            tokens=DirectorTokens(database.query),
        )
        stack._gateway = gateway
        affinity.started_on(pin, gateway.start)
        stack.gateway_url = gateway.url
        stack.director_url = f"{gateway.url}{GRAPHQL_PATH}"
        stack.token_url = f"{gateway.url}{TOKEN_PATH}"
        stack.jwks_url = f"{gateway.url}{JWKS_PATH}"
        stack.connector_url = connector_url or f"{gateway.url}{CONNECTOR_PATH}"

        phase = time.monotonic()
        # Shared by Director and the hydrator: the local file as Compass's chart extends it.
        configuration = real_connector_module.director_configuration(
            local_configuration(source), workdir / "config" / "director-config.yaml"
        )
        stack.director_process = affinity.started_on(
            pin,
            start_director,
            DirectorConfig(
                binary=folder / "director",
                source=source,
                db_port=database.port,
                schema_version=postgres.schema_version(migrations_dir),
                jwks_url=stack.jwks_url,
                public_url=stack.gateway_url,
                token_url=stack.token_url,
                connector_url=stack.connector_url,
                namespace=stack.namespace,
                configuration_file=configuration,
            ),
            stack.cluster,
            workdir,
        )
        gateway.director_url = stack.director_process.graphql_url
        stack.timings["director"] = time.monotonic() - phase

        if reserved is not None:
            assert connector_folder is not None
            phase = time.monotonic()
            key, kid = gateway.signing_key()
            stack.real_connector = real_connector_module.start_real_connector(
                workdir / "connector",
                folder=connector_folder,
                reserved=reserved,
                cluster=stack.cluster,
                namespace=stack.namespace,
                director_port=stack.director_process.port,
                director_configuration_file=configuration,
                signing_key=key,
                signing_kid=kid,
                issuer=stack.gateway_url,
            )
            stack.timings["connector"] = time.monotonic() - phase
        stack.timings["total"] = time.monotonic() - began
    except BaseException:
        with contextlib.suppress(Exception):
            stack.stop()
        raise
    finally:
        if reserved is not None:
            reserved.close()
    return stack


def _resolve(database: postgres.Postgres, external: str) -> str | None:
    rows = database.query(
        "SELECT id FROM business_tenant_mappings WHERE external_tenant = :'ext'", {"ext": external}
    )
    return rows[0][0] if rows else None


@contextlib.contextmanager
def running_real_compass(workdir: Path | None = None, **kwargs: Any) -> Iterator[RealCompass]:
    """`start_real_compass` in a `with` block, in a temporary workdir removed afterwards."""
    own = workdir is None
    folder = workdir or Path(tempfile.mkdtemp(prefix="real-compass-"))
    stack = start_real_compass(folder, **kwargs)
    try:
        yield stack
    finally:
        stack.stop()
        if own:
            shutil.rmtree(folder, ignore_errors=True)


@atexit.register
def _stop_leftovers() -> None:
    for stack in list(_running):
        with contextlib.suppress(Exception):
            stack.stop()
