"""The one log setup: one JSON object per line on stderr, redacted before it is written.

Always holds: a line carries the time, level, logger, message and the `extra=` fields; an
exception adds its type and the stack of frames but not its message (messages of library
errors may quote the input, e.g. a YAML snippet of a kubeconfig); as a last line of defence,
anything shaped like a JWT, a bearer or basic credential, a PEM block, or the value of a
`token`/`TOKEN`/`password`/`client_secret` field is masked in the finished line. Callers still
never pass secrets: redaction catches the shapes we know, not every secret.

Also holds: a line written while a request is served carries its `request_id` (bound with
`bind_request_id`, a context variable, so every line of the request has it, from whatever
module, and tasks started by the request inherit it); no line carries a terminal escape
sequence (uvicorn's `color_message` extra is dropped, escapes in the message are removed: a JSON
line is read by machines and by `kubectl logs` in terminals alike).
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
import traceback
from typing import Any

# `color_message`: uvicorn's copy of the message with ANSI colours, for its own console format.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}
# CSI sequences (colours, cursor moves) and the lone escapes around them.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b")

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


def bind_request_id(request_id: str | None) -> contextvars.Token[str | None]:
    """Every line logged in this context from now on carries `request_id`; undo with
    `unbind_request_id(token)` when the request is over."""
    return _request_id.set(request_id)


def unbind_request_id(token: contextvars.Token[str | None]) -> None:
    _request_id.reset(token)


def current_request_id() -> str | None:
    return _request_id.get()


# Up to its END line, or (a block cut off) to the end of the text.
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|\Z)", re.DOTALL)
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*")
_AUTH = re.compile(r"(?i)\b(bearer|basic)(\s+)[^\s\"',;\\]+")
# `TOKEN: x`, `"token": "x"`, `token=x` (also `client_secret`, `password`), JSON-escaped or not.
_FIELD = re.compile(
    r"(?i)\b(token|access_token|client_secret|password)(\\?[\"']?\s*[:=]\s*\\?[\"']?)"
    r"[^\s\"'\\,;&}]+"
)


def redact(text: str) -> str:
    text = _PEM.sub("[redacted-pem]", text)
    text = _JWT.sub("[redacted-jwt]", text)
    text = _AUTH.sub(r"\1\2[redacted]", text)
    return _FIELD.sub(r"\1\2[redacted]", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _ANSI.sub("", record.getMessage()),
        }
        request_id = _request_id.get()
        if request_id is not None:
            entry["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = _ANSI.sub("", value) if isinstance(value, str) else value
        if record.exc_info and record.exc_info[0] is not None:
            entry["error_type"] = record.exc_info[0].__name__
            entry["stack"] = "".join(traceback.format_tb(record.exc_info[2]))
        return redact(json.dumps(entry, default=str))


def setup(level: str = "INFO") -> None:
    """JSON lines on stderr for the whole process, at `level`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request line at INFO: noise next to our own lines.
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
