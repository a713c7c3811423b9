"""Whether a proven runtime is revoked, and the xfcc deny list's format: pure.

Holds: a runtime is revoked while its mapping carries the annotation
`compass-broker.kyma-project.io/revoked` (whatever its value, the empty string included: the
value is only the operator's reason) or, in xfcc mode, while the SHA-256 hash of its client
certificate (the XFCC `Hash=` element) is on the deny list. Revocation is judged only after the
caller proved to be the runtime, and it never unregisters anything.

Deny list file: one hex SHA-256 hash (64 digits, any case) per line, in the form the XFCC
`Hash=` element is read in (`identity.xfcc.normalise_hash`); `#` starts a comment, blank lines
are ignored; any other line is reported by number and ignored (the rest still counts: one typo
must not lift every other revocation).
"""

from __future__ import annotations

from dataclasses import dataclass

from control_plane_broker.identity.xfcc import normalise_hash
from control_plane_broker.registration.state import Mapping

MAX_REASON = 300

SOURCE_ANNOTATION = "annotation"
SOURCE_DENY_LIST = "deny-list"


@dataclass(frozen=True)
class DenyList:
    hashes: frozenset[str]
    bad_lines: tuple[int, ...] = ()  # 1-based numbers of lines that are not a hash


def parse_deny_list(text: str) -> DenyList:
    hashes: set[str] = set()
    bad: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip().lower()
        if not entry:
            continue
        hashed = normalise_hash(entry)
        if hashed is not None:
            hashes.add(hashed)
        else:
            bad.append(number)
    return DenyList(frozenset(hashes), tuple(bad))


@dataclass(frozen=True)
class Revoked:
    source: str  # SOURCE_ANNOTATION | SOURCE_DENY_LIST
    detail: str


def revoked(
    mapping: Mapping | None, *, certificate_hash: str | None, deny: frozenset[str]
) -> Revoked | None:
    if mapping is not None and mapping.revoked is not None:
        reason = mapping.revoked.strip()[:MAX_REASON]
        detail = "an operator revoked this runtime" + (f": {reason}" if reason else "")
        return Revoked(SOURCE_ANNOTATION, detail)
    if certificate_hash is not None and certificate_hash in deny:
        return Revoked(SOURCE_DENY_LIST, "this runtime's client certificate is on the deny list")
    return None
