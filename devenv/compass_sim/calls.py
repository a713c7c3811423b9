"""One request's view of fault injection, handed to the endpoint handlers.

A handler calls `Call.enter(operation, key)` at the moment an operation would
start doing its work (after authentication, tenant and scope checks): `enter`
raises the injected `DirectorError` for that operation, if one fires. When the
operation succeeded (its effect is committed) the handler calls `Call.done`,
which takes one lost response for that operation, if any are left: so "the next
registerRuntime loses its response" means the next one that took effect.

Director's database faults are asked for here too: `database_answer` before an
operation runs (it then fails without effect, like an injected error),
`commit_fails` once it took effect, `labels_fail` from its Runtime's `labels` field.
A call answered with an error after it took effect is listed in `after_commit`.
"""

from __future__ import annotations

from .errors import DirectorError
from .faults import DatabaseAnswer, FaultState, LostResponseMode

__all__ = ["Call"]


class Call:
    def __init__(self, faults: FaultState) -> None:
        self._faults = faults
        self.lost: LostResponseMode | None = None
        # Response keys (GraphQL aliases or field names) of operations failed on purpose.
        self.injected: set[str] = set()
        # Response keys of operations that took effect and were answered with an error.
        self.after_commit: set[str] = set()
        # Response key -> operation, for the fields resolved below a root field.
        self._operations: dict[str, str] = {}

    def database_answer(self, operation: str, key: str) -> DatabaseAnswer | None:
        """How this operation fails while Director's database is gone (None: it is not)."""
        answer = self._faults.database_answer(operation)
        if answer is not None:
            self.injected.add(key)
        return answer

    def enter(self, operation: str, key: str | None = None) -> None:
        key = key or operation
        self._operations[key] = operation
        injected = self._faults.injected_error(operation)
        if injected is not None:
            self.injected.add(key)
            if injected.message:
                raise DirectorError(injected.error_code, head=injected.message)
            raise DirectorError(injected.error_code)

    def commit_fails(self, operation: str, key: str) -> bool:
        """Whether this operation, which took effect, is answered with a failed commit."""
        if self._faults.take_commit_error(operation):
            self.after_commit.add(key)
            return True
        return False

    def labels_fail(self, key: str) -> bool:
        """Whether the `labels` of the Runtime that the root field `key` answers fail."""
        operation = self._operations.get(key)
        if operation is None or self.lost is not None:
            return False
        if self._faults.take_field_error(operation):
            self.after_commit.add(key)
            return True
        return False

    def done(self, operation: str) -> None:
        mode = self._faults.take_lost_response(operation)
        if mode is not None and self.lost is None:
            self.lost = mode
