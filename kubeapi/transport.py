"""What an HTTP request that failed on the way tells an operator: which server, and why.

Holds: the text names the error's class, the server (scheme, host and port, never a path, a
query or user info) and its cause as the socket or TLS layer said it (`Connection refused`,
`certificate verify failed`, `Name or service not known`), on one line of at most
`MAX_CAUSE` characters without control characters; a bare `ConnectError` told nobody where or
why. Nothing of the request itself (headers, body) is in it.
"""

from __future__ import annotations

import httpx

MAX_CAUSE = 200


def _one_line(text: str) -> str:
    printable = "".join(ch if ch.isprintable() else " " for ch in text)
    return " ".join(printable.split())[:MAX_CAUSE]


def _server(exc: httpx.HTTPError) -> str | None:
    try:
        url = exc.request.url
    except RuntimeError:  # raised without a request (httpx says so by raising)
        return None
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{url.host}{port}"


def _cause(exc: BaseException) -> str:
    """The first non-empty text down the chain: timeouts often have none of their own."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            break
        text = _one_line(str(seen))
        if text:
            return text
        seen = seen.__cause__ or seen.__context__
    return "no detail"


def describe_transport_error(exc: httpx.HTTPError) -> str:
    """`ConnectError (https://10.0.0.1:6443): [Errno 111] Connection refused`."""
    server = _server(exc)
    return f"{type(exc).__name__}" + (f" ({server})" if server else "") + f": {_cause(exc)}"
