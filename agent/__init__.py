"""The runtime half of the pull model: pulls a Compass one-time token from the broker.

Public names are `__all__` and nothing else; they load on first use (PEP 562), so importing a
pure module such as `agent.retry_policy` or `agent.decide` never drags in httpx or the Kubernetes
adapters (the benchmarks rely on that).
"""

# Imported under private names: every public name of this module is in `__all__`.
import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from agent.__main__ import main
    from agent.process import Agent
    from agent.settings import AgentSettings

__all__ = ["Agent", "AgentSettings", "main"]

_HOMES = {"Agent": "agent.process", "AgentSettings": "agent.settings", "main": "agent.__main__"}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'agent' has no attribute {name!r}")
    value = getattr(_importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
