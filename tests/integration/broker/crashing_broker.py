"""Test-only entry point: the real broker, which exits with code 70 right after Director
registered a runtime and before the mapping records it (the crash the exactly-once rule must
survive). The production entry point has no such switch; the hook is a constructor argument
of the composition root."""

from __future__ import annotations

import os
import sys

from control_plane_broker.__main__ import load, serve
from control_plane_broker.kyma import KymaView
from control_plane_broker.wiring import run

CRASH_EXIT_CODE = 70


def crash(_kyma: KymaView, _compass_id: str) -> None:
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)


def main() -> int:
    loaded = load(sys.argv[1:])
    if isinstance(loaded, int):
        return loaded
    settings, kcp_access = loaded
    serve(run(settings, kcp_access=kcp_access, after_register=crash))
    return 0


if __name__ == "__main__":
    sys.exit(main())
