"""One request's view of fault injection, handed to the endpoint handlers.

A handler calls `Call.enter(operation, key)` at the moment an operation would
start doing its work (after authentication, tenant and scope checks): `enter`
raises the injected `DirectorError` for that operation, if one fires. When the
operation succeeded (its effect is committed) the handler calls `Call.done`,
which takes one lost response for that operation, if any are left: so "the next
registerRuntime loses its response" means the next one that took effect.
"""

from __future__ import annotations

from .errors import DirectorError
from .faults import FaultState, LostResponseMode

__all__ = ["Call"]


class Call:
    def __init__(self, faults: FaultState) -> None:
        self._faults = faults
        self.lost: LostResponseMode | None = None
        # Response keys (GraphQL aliases or field names) of operations failed on purpose.
        self.injected: set[str] = set()

    def enter(self, operation: str, key: str | None = None) -> None:
        key = key or operation
        injected = self._faults.injected_error(operation)
        if injected is not None:
            self.injected.add(key)
            if injected.message:
                raise DirectorError(injected.error_code, head=injected.message)
            raise DirectorError(injected.error_code)

    def done(self, operation: str) -> None:
        mode = self._faults.take_lost_response(operation)
        if mode is not None and self.lost is None:
            self.lost = mode
