"""A tiny issuer-keys server: `GET /rt/<runtime ID>/openid/v1/jwks` for every simulated runtime.

Run as `python -m bench.jwks_server KEYS_JSON` ({runtime ID: [JWK, ...]}); it binds 127.0.0.1 on a
free port, prints `{"port": N}` on stdout and serves until SIGTERM. It stands in for each runtime
API server's `/openid/v1/jwks` (the broker's `jwks` mode with `BROKER_JWKS_ISSUER_URL`
`http://127.0.0.1:N/rt/{runtime_id}`). A separate process, so its CPU is not charged to the fleet.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PREFIX, SUFFIX = "/rt/", "/openid/v1/jwks"


def jwks_path(runtime_id: str) -> str:
    return f"{PREFIX}{runtime_id}{SUFFIX}"


def runtime_of(path: str) -> str | None:
    """The runtime ID in a JWKS path, None for any other path."""
    if not (path.startswith(PREFIX) and path.endswith(SUFFIX)):
        return None
    runtime_id = path[len(PREFIX) : -len(SUFFIX)]
    return runtime_id if runtime_id and "/" not in runtime_id else None


def make_handler(documents: dict[str, bytes]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the broker's httpx client expects

        def do_GET(self) -> None:
            runtime_id = runtime_of(self.path.split("?", 1)[0])
            body = documents.get(runtime_id or "")
            if body is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/jwk-set+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # thousands of fetches: no access log

    return Handler


class Server(ThreadingHTTPServer):
    # The stdlib's listen backlog is 5: a broker fetching keys for hundreds of new runtimes at
    # once would see dropped SYNs and second-long connect retries, which is not what a real
    # API server does.
    request_queue_size = 1024
    daemon_threads = True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.jwks_server KEYS_JSON", file=sys.stderr)
        return 2
    keys: dict[str, list[dict[str, Any]]] = json.loads(Path(args[0]).read_text())
    documents = {rid: json.dumps({"keys": jwks}).encode() for rid, jwks in keys.items()}
    server = Server(("127.0.0.1", 0), make_handler(documents))
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    while not stop.wait(1.0):
        pass
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
