"""What both processes check before they start, beyond well-typed settings: that a CA file can be
read and that an address can be listened on. Each check answers None or why not, in an
operator's words (the OS's reason, never a traceback); the caller names the variable."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path


def reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


def ca_file_problem(path: Path) -> str | None:
    try:
        ssl.create_default_context().load_verify_locations(cafile=str(path))
    except (OSError, ssl.SSLError, ValueError) as exc:
        return f"{path}: no PEM CA certificates can be read from it ({reason(exc)})"
    return None


def listen_problem(host: str, port: int) -> str | None:
    """Asked before anything starts, with the options the servers bind with: a port that is
    taken or privileged would otherwise end a process that already started its work."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        return f"cannot listen on {host}:{port} ({reason(exc)})"
    return None
