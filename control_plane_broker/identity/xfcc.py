"""Identity from `X-Forwarded-Client-Cert`, set by the Istio gateway after it verified the client
certificate of the control plane's watcher PKI. The certificate's CN is the runtime ID.

The header is trusted only when the broker is configured to sit behind that gateway; otherwise
it proves nothing (a client could send it itself). The parser is pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from control_plane_broker.errors import IdentityForbidden, IdentityNotProven
from control_plane_broker.identity.claims import Identity

HEADER = "x-forwarded-client-cert"


def split_elements(value: str) -> list[dict[str, str]]:  # noqa: PLR0912 (one small scanner)
    """Splits an XFCC value into elements (`,`) of `key=value` pairs (`;`), honouring quotes."""
    elements: list[dict[str, str]] = []
    current: dict[str, str] = {}
    key, buf, in_quotes, reading_key = "", [], False, True
    i = 0
    while i < len(value):
        ch = value[i]
        if in_quotes:
            if ch == "\\" and i + 1 < len(value):
                buf.append(value[i + 1])
                i += 2
                continue
            if ch == '"':
                in_quotes = False
            else:
                buf.append(ch)
        elif ch == '"':
            in_quotes = True
        elif ch == "=" and reading_key:
            key, buf, reading_key = "".join(buf).strip(), [], False
        elif ch in ";,":
            if key:
                current[key.lower()] = "".join(buf)
            key, buf, reading_key = "", [], True
            if ch == ",":
                elements.append(current)
                current = {}
        else:
            buf.append(ch)
        i += 1
    if key:
        current[key.lower()] = "".join(buf)
    if current:
        elements.append(current)
    return elements


def subject_cn(subject: str) -> str | None:
    for part in subject.split(","):
        name, _, val = part.strip().partition("=")
        if name.strip().upper() == "CN":
            return val.strip()
    return None


def identity_from_xfcc(headers: Mapping[str, str], *, runtime_id: str, trusted: bool) -> Identity:
    if not trusted:
        raise IdentityNotProven("client certificates are not trusted here", reason="xfcc-untrusted")
    value = headers.get(HEADER)
    if not value:
        raise IdentityNotProven("no forwarded client certificate", reason="missing")
    elements = split_elements(value)
    # The gateway appends its own element last; earlier ones could come from the client.
    cn = subject_cn(elements[-1].get("subject", "")) if elements else None
    if not cn:
        raise IdentityNotProven("forwarded certificate has no CN", reason="malformed")
    if cn.lower() != runtime_id.lower():
        raise IdentityForbidden("certificate belongs to another runtime", reason="runtime-mismatch")
    return Identity(runtime_id=runtime_id, subject=f"CN={cn}", mode="xfcc")
