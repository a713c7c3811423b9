"""Compass simulator: OAuth token endpoint, Director and Connector, with fault injection.

What it is for: faults (down, lost answers, injected errors, rate limits, latency,
limited capacity) and scale (thousands of runtimes in memory, no build), which the
real Director cannot give. What it answers follows the real Director: the contract
test `tests/integration/real_director/test_contract.py` sends the same requests to
both and compares status, error codes, paths, messages, shapes, the labels Director
adds and token fields, with the real one as the oracle.

Run it:  python -m devenv.compass_sim --client-id ID --client-secret SECRET [--port N] ...
(see --help), or in-process:

    from devenv.compass_sim import CompassSimulator, SimConfig, Faults

    sim = CompassSimulator(SimConfig(client_id="id", client_secret="secret"))
    with sim.running() as sim:               # background thread, free port
        sim.token_url, sim.director_url, sim.connector_url, sim.admin_url
        sim.update_faults(lost_responses={"registerRuntime": 1})
        ...
        assert sim.counter("registerRuntime").attempts == 1

Endpoints (main listener, `sim.url`):
    POST /oauth/token         client credentials (Basic auth), scopes runtime:read/write
    POST /director/graphql    `director.graphql` (Bearer + `Tenant` header)
    GET|POST /connector/graphql  `connector.graphql` (`Connector-Token` header, or `?token=`)
    /_sim/...                 admin JSON API, also on the admin listener (`sim.admin_url`),
                              which stays up while faults make the main listener refuse:
    GET  /_sim/health                       {"ok", "down", "listening"}
    GET|PUT|PATCH|DELETE /_sim/faults       read / replace / merge top-level fields / clear
    GET  /_sim/counters                     {operation: OperationCounter}
    GET  /_sim/concurrency                  ConcurrencyStats of Director requests
    GET  /_sim/requests?operation=&tenant=&outcome=&since=   [RequestRecord]
    POST /_sim/reset   {"state","faults","counters": bool, default true}
    GET  /_sim/runtimes?tenant=             [RuntimeRecord];  POST: seed one (no validation)
    GET  /_sim/tokens?runtime_id=           Connector token metadata (hashes, never tokens)
    POST /_sim/save                         write the state file now

Python API of `CompassSimulator(config, *, clock=None, rng=None, access_log=False)`:
    start(host="127.0.0.1", port=0, *, admin_port=0, timeout=15) -> Self;  stop();
    running(host="127.0.0.1", port=0, *, admin_port=0) -> context manager;  with sim: ...
    url, admin_url, port, public_url, token_url, director_url, connector_url, listening
    faults() -> Faults;  set_faults(Faults) -> Faults;  update_faults(**fields) -> Faults;
    clear_faults() -> Faults
    counters() -> dict[str, OperationCounter];  counter(operation) -> OperationCounter
    request_log(*, operation=None, tenant=None, outcome=None, since_seq=0) -> list[RequestRecord]
    concurrency() -> ConcurrencyStats
    runtimes(tenant=None) -> list[RuntimeRecord];  runtime(runtime_id) -> RuntimeRecord | None
    connector_tokens(runtime_id=None) -> list[ConnectorTokenRecord]
    seed_runtime(*, tenant, name, labels=None, description=None, runtime_id=None, status=INITIAL)
    issue_access_token(scopes=("runtime:read", "runtime:write")) -> str
    reset(*, state=True, faults=True, counters=True);  save_state() -> bool

Operations (keys of counters, faults and the request log): "oauthToken", Director's
root fields ("registerRuntime", "runtimes", ...) and Connector's ("configuration",
"signCertificateSigningRequest"); see `operations.py`.

Faults (`faults.py`): `down` ("refuse" | "drop" | "503"), `latency` (fixed + jitter),
`errors` (per operation: Director error code or HTTP status, rate, count),
`lost_responses` ({operation: count}: executed, then 504 or dropped connection),
`rate_limit` (429 + Retry-After), `max_concurrent_director_requests` (queueing);
Director's database: `database_down` (every Director call fails without effect, HTTP
200, codes 10 / 26 in turn), `commit_then_error` ({mutation: count}: it takes effect,
then code 10 "while committing transaction"), `field_error_after_commit` ({operation:
count}: it takes effect, its Runtime's `labels` is null with a code-10 error).

Tenants (`SimConfig.accounts`): global accounts and their subaccounts with regions,
as Director's tenant fetcher would have synced them; unknown tenants get HTTP 400 code
25, unknown subaccounts code 20. Without `accounts` every tenant is accepted and a new
`global_subaccount_id` becomes a subaccount of its first caller (benches, demos).
`SimConfig.consumer_type` (default "Integration System", as compass-manager's client)
makes Director label registered runtimes `runtimeType: kyma` and `region`.

Choices where a gateway, not Director/Connector, answers in the real Compass:
- a missing, unknown or expired bearer token gets HTTP 401 with one GraphQL error
  entry, `extensions.error_code` 26 (no `data`; Oathkeeper's body differs, the
  status is what clients act on);
- a Connector token that names no one (spent, expired, unknown, missing) gets HTTP 400
  with an empty body, as Compass's Oathkeeper, hydrator and Connector answer it (the
  contract test `tests/integration/real_director/test_connector_contract.py` holds the
  simulator's Connector to the real one).
Director's real page-size limit is 200 (`runtimes(first:)`, `SimConfig.max_page_size`).

`devenv.compass_sim.testing` has small pytest-free helpers (token, GraphQL calls,
the GraphQL documents the tests use, a CSR builder).
"""

from .capacity import ConcurrencyStats
from .config import CsrSubject, SimConfig
from .errors import ErrorCode
from .faults import DownMode, Faults, InjectedError, Latency, LostResponseMode, RateLimit
from .operations import ALL_OPERATIONS, READ_SCOPE, WRITE_SCOPE
from .recorder import OperationCounter, Outcome, RequestRecord
from .server import CompassSimulator
from .store import ConnectorTokenRecord, RuntimeRecord, RuntimeStatusCondition, TokenKind

__all__ = [
    "ALL_OPERATIONS",
    "READ_SCOPE",
    "WRITE_SCOPE",
    "CompassSimulator",
    "ConcurrencyStats",
    "ConnectorTokenRecord",
    "CsrSubject",
    "DownMode",
    "ErrorCode",
    "Faults",
    "InjectedError",
    "Latency",
    "LostResponseMode",
    "OperationCounter",
    "Outcome",
    "RateLimit",
    "RequestRecord",
    "RuntimeRecord",
    "RuntimeStatusCondition",
    "SimConfig",
    "TokenKind",
]
