"""The tenants Director knows: global accounts, their subaccounts and the subaccounts' regions.

In Compass a tenant is a row synced by the tenant fetcher; a subaccount has its global
account as parent. A runtime registered with label `global_subaccount_id` is owned by
that subaccount, which must be the caller or one of its children, and is visible to the
owner and its parents. Director labels a runtime registered by an Integration System
with the owning subaccount's `region` label ("" without a subaccount or a region).

Strict mode (`SimConfig.accounts` given) knows exactly the configured tenants. The
permissive mode (no accounts: benches, demos, most tests) accepts every tenant and
makes a subaccount it meets for the first time a child of the caller, as Director does
with on-demand tenant fetching; a subaccount later claimed by another caller is refused
as the real one refuses it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from .config import GlobalAccount
from .errors import DirectorError
from .store import Store

__all__ = ["NOT_A_CHILD", "Ownership", "Tenants", "internal_tenant_id"]

NOT_A_CHILD = "Tenant provided in global_subaccount_id label should be child of the caller tenant"
_INTERNAL_IDS = uuid.UUID("5f0c3c9e-2b1d-4c55-9a57-7c1d0e6a4b21")


def internal_tenant_id(external: str) -> str:
    """The UUID Director keeps a tenant under (its messages name tenants by it); stable per
    external ID, as the tenant fetcher's row would be."""
    return str(uuid.uuid5(_INTERNAL_IDS, external))


@dataclass(frozen=True)
class Ownership:
    owner: str
    parents: tuple[str, ...]
    region: str


class Tenants:
    def __init__(self, accounts: dict[str, GlobalAccount] | None, store: Store) -> None:
        self._strict = accounts is not None
        self._store = store
        self._known: set[str] = set()
        self._parent: dict[str, str] = {}
        self._region: dict[str, str | None] = {}
        for account_id, account in (accounts or {}).items():
            self._known.add(account_id)
            for subaccount_id, subaccount in account.subaccounts.items():
                self._known.add(subaccount_id)
                self._parent[subaccount_id] = account_id
                self._region[subaccount_id] = subaccount.region

    def knows(self, tenant: str) -> bool:
        return not self._strict or tenant in self._known

    def _parent_of(self, tenant: str) -> str | None:
        if self._strict:
            return self._parent.get(tenant)
        return self._store.subaccount_parent(tenant)

    def parents(self, tenant: str) -> tuple[str, ...]:
        parent = self._parent_of(tenant)
        return () if parent is None else (parent,)

    def owner_for(self, caller: str, subaccount: str | None) -> Ownership:
        """Who owns a runtime `caller` registers; raises Director's error when it may not."""
        if subaccount is None:
            return Ownership(caller, self.parents(caller), "")
        if subaccount == caller:
            return Ownership(caller, self.parents(caller), self._region.get(caller) or "")
        if self._strict:
            if subaccount not in self._known:
                raise DirectorError.not_found("tenant")
            parent = self._parent.get(subaccount)
        else:
            parent = self._store.adopt_subaccount(subaccount, caller)
        if parent != caller:
            raise DirectorError.not_allowed(NOT_A_CHILD)
        return Ownership(subaccount, (caller,), self._region.get(subaccount) or "")
