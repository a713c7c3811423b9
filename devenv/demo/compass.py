"""What the story asks of "Compass", whoever plays it: the simulator (default) or the real Director.

`CompassView` is the story's only way to look at and switch Compass: the runtimes a global account
has, the Director calls made for it, the Connector tokens a runtime spent, and the outage switch.
`SimAdmin` (`observe.py`) answers from the simulator's admin API; `RealDirectorView` answers from
the real Director's own database and our gateway in front of it (`devenv/real_director`):

- runtimes of a global account: `/_sim/runtimes`; real: Director's database (`tenant_runtimes`);
- Director calls for a tenant: `/_sim/requests` (with failures); real: the gateway's count per
  `Tenant` header (no outcomes);
- Connector tokens a runtime spent: `/_sim/tokens`; real: the gateway's Connector, which spends
  them in Director's `system_auths`;
- Compass down and back: the simulator's fault `down`; real: the gateway's fault `down` (the same
  routes: OAuth, Director, Connector; Director itself runs on).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from devenv.demo.observe import DirectorCalls
from devenv.real_director import RealCompass


class CompassView(Protocol):
    calls_source: str  # where the Director call counts come from, in words

    def runtimes(self, tenant: str) -> list[dict[str, Any]]: ...

    def director_calls(self, tenant: str) -> DirectorCalls: ...

    def connector_exchanges(self, runtime_id: str) -> int: ...

    def set_down(self, mode: str) -> None: ...

    def clear_faults(self) -> None: ...

    def listening(self) -> bool: ...

    def close(self) -> None: ...


class RealDirectorView:
    """The real Director's stack, seen as the story sees Compass. `close()` stops the stack."""

    calls_source = (
        "as the gateway counted them in front of the real Director; it records no outcomes, "
        "so failed calls are not marked"
    )

    def __init__(self, stack: RealCompass) -> None:
        self.stack = stack

    def runtimes(self, tenant: str) -> list[dict[str, Any]]:
        """Runtimes the global account (external ID) has access to, in Director's database."""
        return [dict(r) for r in self.stack.tenant_runtimes(tenant)]

    def director_calls(self, tenant: str) -> DirectorCalls:
        return DirectorCalls(made=Counter(self.stack.calls(tenant)))

    def connector_exchanges(self, runtime_id: str) -> int:
        return self.stack.connector_exchanges(runtime_id)

    def set_down(self, mode: str) -> None:
        if mode not in ("refuse", "drop", "503"):
            raise ValueError(f"unknown outage mode {mode!r}")
        self.stack.set_down(mode)  # type: ignore[arg-type]  # checked just above

    def clear_faults(self) -> None:
        self.stack.clear_down()

    def listening(self) -> bool:
        return self.stack.listening()

    def close(self) -> None:
        self.stack.stop()
