"""In-memory Director state: runtimes per tenant and Connector tokens.

Invariants:
- A runtime is owned by exactly one tenant and is visible to it and to that tenant's
  parents (a runtime registered in a subaccount is listed from its global account
  too, as Director's tenant access propagates upwards); every lookup takes the
  caller's tenant, so one tenant never sees another's runtimes. Runtimes are indexed
  by ID (dict) and kept per visible tenant; names are not unique.
- Records are immutable pydantic models; a change replaces the record.
- Connector tokens (one-time tokens from Director and the CSR tokens Connector
  hands out) are kept only as SHA-256 hashes, bound to a runtime and tenant, and
  disappear with their runtime. Each sits on a SystemAuth, as in Director: a one-time
  token from Director on a new one, the token `configuration` returns on the same one,
  which holds one unused token at a time (a new one replaces it). The SystemAuth's ID is
  the CN of the certificate Connector signs for it.
- Subaccounts met for the first time in permissive mode are remembered with their
  parent (state, like the runtimes: cleared and saved with them).
- A label index maps (tenant, key, scalar value) to runtime IDs, where a list value
  indexes each scalar element: the usual lookup "the runtime whose label K is V" is
  answered without scanning the tenant (benchmarks hold thousands of runtimes).
- Every method takes the store's lock, so the store can be read from test threads
  while the server thread writes. `version` grows with every change (used to save
  the state file only when something changed).

No validation happens here: `director.py` and `connector.py` enforce the rules.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from .labels import LabelFilter, matches

_IndexKey = tuple[str, str]  # (label key, canonical JSON of a scalar value)


def _canonical(value: Any) -> str:
    # Containment compares numbers by value (1 == 1.0) but keeps booleans apart.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True)


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, dict | list)


def _index_keys(labels: dict[str, Any]) -> Iterator[_IndexKey]:
    for key, value in labels.items():
        if isinstance(value, list):
            for element in value:
                if _is_scalar(element):
                    yield key, _canonical(element)
        elif _is_scalar(value):
            yield key, _canonical(value)


__all__ = [
    "ConnectorTokenRecord",
    "RuntimeRecord",
    "RuntimeStatusCondition",
    "Store",
    "TokenKind",
    "TokenRefusedError",
]


class RuntimeStatusCondition(StrEnum):
    INITIAL = "INITIAL"
    PROVISIONING = "PROVISIONING"
    CONNECTED = "CONNECTED"
    FAILED = "FAILED"


class RuntimeRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    tenant: str  # the owner
    # The owner's parents when the runtime was registered: they see it too.
    parents: tuple[str, ...] = ()
    name: str
    description: str | None = None
    labels: dict[str, Any]
    status_condition: RuntimeStatusCondition = RuntimeStatusCondition.INITIAL
    status_timestamp: datetime
    creation_timestamp: datetime
    application_namespace: str | None = None

    @property
    def visible_to(self) -> tuple[str, ...]:
        return (self.tenant, *self.parents)


class TokenKind(StrEnum):
    ONE_TIME = "one_time"  # issued by Director's requestOneTimeTokenForRuntime
    CSR = "csr"  # issued by Connector's configuration, used to sign the CSR


class ConnectorTokenRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    token_hash: str
    kind: TokenKind
    runtime_id: str
    tenant: str
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None = None
    # The SystemAuth holding the token ("" in states saved before it was kept: the runtime's
    # ID stands in).
    system_auth_id: str = ""

    @property
    def used(self) -> bool:
        return self.used_at is not None

    @property
    def auth_id(self) -> str:
        """The SystemAuth's ID: Connector's client ID, the certificate's CN."""
        return self.system_auth_id or self.runtime_id


class TokenRefusedError(Exception):
    """A Connector token that is unknown, already used, expired or of the wrong kind."""


class Store:
    def __init__(self, *, new_id: Callable[[], str] | None = None) -> None:
        self._lock = threading.RLock()
        self._new_id = new_id or (lambda: str(uuid.uuid4()))
        self._by_id: dict[str, RuntimeRecord] = {}
        self._by_tenant: dict[str, dict[str, RuntimeRecord]] = {}
        self._sorted: dict[str, list[RuntimeRecord]] = {}
        self._index: dict[str, dict[_IndexKey, set[str]]] = {}
        self._tokens: dict[str, ConnectorTokenRecord] = {}
        self._tokens_of: dict[str, set[str]] = {}  # runtime ID -> token hashes
        self._auths: dict[str, str] = {}  # SystemAuth ID -> its latest token's hash
        self._subaccount_parents: dict[str, str] = {}
        self.version = 0

    # -- runtimes -------------------------------------------------------------

    def _put(self, record: RuntimeRecord) -> None:
        previous = self._by_id.get(record.id)
        if previous is not None:
            self._unindex(previous)
        self._by_id[record.id] = record
        for tenant in record.visible_to:
            self._by_tenant.setdefault(tenant, {})[record.id] = record
            index = self._index.setdefault(tenant, {})
            for key in _index_keys(record.labels):
                index.setdefault(key, set()).add(record.id)
            self._sorted.pop(tenant, None)
        self.version += 1

    def _unindex(self, record: RuntimeRecord) -> None:
        for tenant in record.visible_to:
            index = self._index.get(tenant, {})
            for key in _index_keys(record.labels):
                ids = index.get(key)
                if ids is not None:
                    ids.discard(record.id)
                    if not ids:
                        del index[key]
            runtimes = self._by_tenant.get(tenant, {})
            runtimes.pop(record.id, None)
            if not runtimes:
                self._by_tenant.pop(tenant, None)
            self._sorted.pop(tenant, None)

    def create_runtime(
        self,
        tenant: str,
        *,
        now: datetime,
        parents: tuple[str, ...] = (),
        **fields: Any,
    ) -> RuntimeRecord:
        with self._lock:
            runtime_id = fields.pop("id", None) or self._new_id()
            record = RuntimeRecord(
                id=runtime_id,
                tenant=tenant,
                parents=parents,
                status_timestamp=now,
                creation_timestamp=now,
                **fields,
            )
            self._put(record)
            return record

    def get_runtime(self, tenant: str, runtime_id: str) -> RuntimeRecord | None:
        """The runtime if `tenant` may see it."""
        with self._lock:
            record = self._by_id.get(runtime_id)
            return record if record is not None and tenant in record.visible_to else None

    def find_runtime(self, runtime_id: str) -> RuntimeRecord | None:
        """A runtime of any tenant (Director's one-time tokens check no ownership)."""
        with self._lock:
            return self._by_id.get(runtime_id)

    def replace_runtime(self, record: RuntimeRecord) -> RuntimeRecord:
        with self._lock:
            current = self._by_id.get(record.id)
            if current is None or current.visible_to != record.visible_to:
                raise KeyError(record.id)
            self._put(record)
            return record

    def delete_runtime(self, tenant: str, runtime_id: str) -> RuntimeRecord | None:
        with self._lock:
            record = self.get_runtime(tenant, runtime_id)
            if record is None:
                return None
            self._unindex(record)
            del self._by_id[runtime_id]
            for token_hash in self._tokens_of.pop(runtime_id, set()):
                token = self._tokens.pop(token_hash, None)
                if token is not None:
                    self._auths.pop(token.auth_id, None)
            self.version += 1
            return record

    def list_runtimes(
        self, tenant: str, filters: list[LabelFilter], *, offset: int, limit: int
    ) -> tuple[list[RuntimeRecord], int]:
        """One page of the runtimes the tenant sees matching all filters, ordered by name, ID."""
        with self._lock:
            if not filters:
                selected = self._sorted.get(tenant)
                if selected is None:
                    selected = sorted(
                        self._by_tenant.get(tenant, {}).values(), key=lambda r: (r.name, r.id)
                    )
                    self._sorted[tenant] = selected
            else:
                pool = self._candidates(tenant, filters)
                selected = sorted(
                    (r for r in pool if matches(filters, r.labels)), key=lambda r: (r.name, r.id)
                )
        return selected[offset : offset + limit], len(selected)

    def _candidates(self, tenant: str, filters: list[LabelFilter]) -> Iterable[RuntimeRecord]:
        """Runtimes that may match: narrowed by the index for scalar queries."""
        ids: set[str] | None = None
        index = self._index.get(tenant, {})
        for f in filters:
            if f.has_query and _is_scalar(f.query):
                found = index.get((f.key, _canonical(f.query)), set())
                ids = set(found) if ids is None else ids & found
        if ids is None:
            return list(self._by_tenant.get(tenant, {}).values())
        return [self._by_id[i] for i in ids]

    def runtimes(self, tenant: str | None = None) -> list[RuntimeRecord]:
        """All runtimes, or those `tenant` sees (its own and its subaccounts')."""
        with self._lock:
            if tenant is None:
                return list(self._by_id.values())
            return list(self._by_tenant.get(tenant, {}).values())

    # -- subaccounts met in permissive mode ---------------------------------------

    def subaccount_parent(self, subaccount: str) -> str | None:
        with self._lock:
            return self._subaccount_parents.get(subaccount)

    def adopt_subaccount(self, subaccount: str, parent: str) -> str:
        """Record `subaccount` under `parent` unless already known; returns its parent."""
        with self._lock:
            known = self._subaccount_parents.get(subaccount)
            if known is None:
                self._subaccount_parents[subaccount] = known = parent
                self.version += 1
            return known

    # -- connector tokens -------------------------------------------------------

    def add_token(self, record: ConnectorTokenRecord) -> None:
        """Keeps the token; an unused one its SystemAuth held before is gone (replaced)."""
        with self._lock:
            previous = self._tokens.get(self._auths.get(record.auth_id, ""))
            if previous is not None and not previous.used:
                del self._tokens[previous.token_hash]
                self._tokens_of.get(previous.runtime_id, set()).discard(previous.token_hash)
            self._tokens[record.token_hash] = record
            self._tokens_of.setdefault(record.runtime_id, set()).add(record.token_hash)
            self._auths[record.auth_id] = record.token_hash
            self.version += 1

    def system_auth(self, auth_id: str) -> ConnectorTokenRecord | None:
        """The latest token of a SystemAuth (a certificate's CN): its runtime and tenant; None
        when there is none (never issued, or its runtime is gone)."""
        with self._lock:
            return self._tokens.get(self._auths.get(auth_id, ""))

    def consume_token(
        self, token_hash: str, *, kinds: Iterable[TokenKind], now: datetime
    ) -> ConnectorTokenRecord:
        """Mark the token used and return it; raises TokenRefusedError with the reason."""
        with self._lock:
            record = self._tokens.get(token_hash)
            if record is None or record.kind not in set(kinds):
                raise TokenRefusedError("token is not valid")
            if record.used:
                raise TokenRefusedError("token was already used")
            if record.expires_at <= now:
                raise TokenRefusedError("token has expired")
            used = record.model_copy(update={"used_at": now})
            self._tokens[token_hash] = used
            self.version += 1
            return used

    def tokens(self, runtime_id: str | None = None) -> list[ConnectorTokenRecord]:
        with self._lock:
            return [
                t for t in self._tokens.values() if runtime_id is None or t.runtime_id == runtime_id
            ]

    # -- whole state ------------------------------------------------------------

    def clear(self) -> None:
        with self._lock:
            self._by_id.clear()
            self._by_tenant.clear()
            self._sorted.clear()
            self._index.clear()
            self._tokens.clear()
            self._tokens_of.clear()
            self._auths.clear()
            self._subaccount_parents.clear()
            self.version += 1

    def to_storage(self) -> dict[str, Any]:
        with self._lock:
            return {
                "runtimes": [r.model_dump(mode="json") for r in self._by_id.values()],
                "connector_tokens": [t.model_dump(mode="json") for t in self._tokens.values()],
                "subaccounts": dict(self._subaccount_parents),
            }

    def load_storage(self, data: dict[str, Any]) -> None:
        runtimes = [RuntimeRecord.model_validate(r) for r in data.get("runtimes", [])]
        tokens = [ConnectorTokenRecord.model_validate(t) for t in data.get("connector_tokens", [])]
        with self._lock:
            self.clear()
            for record in runtimes:
                self._put(record)
            for token in sorted(tokens, key=lambda t: t.created_at):
                self._tokens[token.token_hash] = token
                self._tokens_of.setdefault(token.runtime_id, set()).add(token.token_hash)
                self._auths[token.auth_id] = token.token_hash
            self._subaccount_parents.update(data.get("subaccounts", {}))
