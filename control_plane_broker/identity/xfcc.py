"""Identity from `X-Forwarded-Client-Cert`, set by the Istio gateway after it verified the client
certificate of the control plane's watcher PKI. The certificate's CN is the runtime ID.

The header is trusted only when the broker is configured to sit behind that gateway and the
gateway is the only way in (the chart's NetworkPolicy); otherwise it proves nothing, since a
client could send it itself. Everything here is pure.

What always holds:

- The header follows Envoy's XFCC grammar: elements separated by `,`, each a `;`-separated list
  of `key=value` pairs; keys are case-insensitive; a value is either bare (no `,;="\\`) or
  double-quoted, where a backslash makes the next character part of the value. Of several header
  lines, the HTTP layer passes the last one on. Anything else (an unterminated quote, text after a
  closing quote, an empty element, a pair without `=`) is refused, never guessed at.
- Only the *last* element counts: Envoy appends the element of the proxy that verified the
  client certificate at the end (`APPEND_FORWARD`) or replaces the header with that one element
  (`SANITIZE_SET`). Earlier elements may come from the client.
- The CN is read from the Subject by RFC 4514 (Envoy prints it as RFC 2253 text, whose escapes
  RFC 4514 keeps): escaped characters (`\\,` `\\+` `\\"` `\\\\` `\\;` `\\<` `\\>` `\\=` `\\ ` `\\#`)
  and `\\XX` hex pairs (UTF-8 bytes) are part of a value, never separators. So
  `Subject="O=evil\\,CN=rt-1"` is one O attribute and has no CN. Multi-valued RDNs (`+`) are
  read attribute by attribute; spaces around separators are ignored.
- A Subject with more than one CN attribute, or an element with more than one Subject, is
  ambiguous and refused. A CN written as a BER hex string (`CN=#...`) is refused too.

Quoted values keep their backslashes: the Subject is RFC 2253 text whose `\\"` and `\\\\` are
RFC 4514 escapes, so they are undone exactly once, by the DN parser.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from control_plane_broker.errors import IdentityForbidden, IdentityNotProven
from control_plane_broker.identity.claims import Identity

HEADER = "x-forwarded-client-cert"
# Far above a real element with a full certificate chain, far below what would cost real time.
MAX_HEADER_CHARS = 65536
# Envoy documents URI and DNS as repeatable (one pair per SAN); every other key is single.
REPEATABLE_KEYS = frozenset({"uri", "dns"})
CN_TYPES = frozenset({"cn", "commonname", "2.5.4.3"})
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

_OWS = " \t"
_BARE_FORBIDDEN = frozenset(',;="\\')
_DN_SPECIAL = frozenset('\\"+,;<>')
_DN_ESCAPABLE = frozenset('\\"+,;<> #=')
_HEX = frozenset("0123456789abcdefABCDEF")


class XfccMalformed(ValueError):
    """The header or its Subject breaks the grammar, or is ambiguous.

    `reason` is a fixed word for metrics (`malformed` or `ambiguous`); messages never quote
    the header, which is the caller's input.
    """

    def __init__(self, message: str, *, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class XfccElement:
    """One proxy's element: its pairs in order, keys lower-cased, quoted values unquoted with
    their backslash escapes kept."""

    pairs: tuple[tuple[str, str], ...]

    def values(self, key: str) -> list[str]:
        return [value for k, value in self.pairs if k == key.lower()]

    def single(self, key: str) -> str | None:
        found = self.values(key)
        if len(found) > 1:
            raise XfccMalformed(f"more than one {key} in an element", reason="ambiguous")
        return found[0] if found else None


@dataclass(frozen=True)
class Attribute:
    type: str  # as written: a descriptor such as CN, or a dotted OID
    value: str  # unescaped text, or the hex digits of a BER value when `ber` is set
    ber: bool = False


# --- XFCC --------------------------------------------------------------------------------------


class _Scanner:
    """A cursor over one string; every method either consumes what the grammar allows or raises."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def skip_ows(self) -> None:
        while self.peek() and self.peek() in _OWS:
            self.pos += 1


def _check_characters(text: str) -> None:
    if len(text) > MAX_HEADER_CHARS:
        raise XfccMalformed("forwarded client certificate header too long")
    if any((ord(ch) < 0x20 and ch != "\t") or ord(ch) == 0x7F for ch in text):
        raise XfccMalformed("control character in the forwarded client certificate header")


def _key(s: _Scanner) -> str:
    start = s.pos
    while s.peek() and s.peek() not in _BARE_FORBIDDEN and s.peek() not in _OWS:
        s.pos += 1
    key = s.text[start : s.pos]
    s.skip_ows()
    if not key or s.peek() != "=":
        raise XfccMalformed("an XFCC pair is not key=value")
    s.pos += 1
    return key.lower()


def _quoted(s: _Scanner) -> str:
    s.pos += 1  # the opening quote
    start = s.pos
    while True:
        ch = s.peek()
        if not ch:
            raise XfccMalformed("unterminated quoted XFCC value")
        if ch == "\\":
            if s.pos + 1 >= len(s.text):
                raise XfccMalformed("unterminated quoted XFCC value")
            s.pos += 2
            continue
        if ch == '"':
            value = s.text[start : s.pos]
            s.pos += 1
            return value
        s.pos += 1


def _bare(s: _Scanner) -> str:
    start = s.pos
    while s.peek() and s.peek() not in ",;":
        if s.peek() in _BARE_FORBIDDEN:
            raise XfccMalformed("a bare XFCC value holds a character that needs quoting")
        s.pos += 1
    return s.text[start : s.pos].rstrip(_OWS)


def _element(s: _Scanner) -> XfccElement:
    pairs: list[tuple[str, str]] = []
    while True:
        s.skip_ows()
        key = _key(s)
        s.skip_ows()
        value = _quoted(s) if s.peek() == '"' else _bare(s)
        pairs.append((key, value))
        s.skip_ows()
        if s.peek() != ";":
            break
        s.pos += 1
    if s.peek() not in ("", ","):
        raise XfccMalformed("text after a quoted XFCC value")
    element = XfccElement(tuple(pairs))
    for key in {k for k, _ in pairs} - REPEATABLE_KEYS:
        element.single(key)
    return element


def parse_xfcc(value: str) -> list[XfccElement]:
    """All elements of one header value, in order."""
    _check_characters(value)
    s = _Scanner(value)
    elements = [_element(s)]
    while s.peek() == ",":
        s.pos += 1
        elements.append(_element(s))
    if not s.at_end():  # pragma: no cover - _element stops only at ",", or raises
        raise XfccMalformed("unexpected text in the XFCC header")
    return elements


# --- RFC 4514 distinguished names --------------------------------------------------------------
#
# Our own parser, not `cryptography.x509.Name.from_rfc4514_string` (cryptography 51), which the
# property tests in tests/unit/broker/test_xfcc.py were run against and which fails cases this one
# reads correctly (test_the_library_parser_misreads_subjects_this_one_reads):
# - it refuses any attribute type it has no name for: `serialNumber=42,CN=rt-1` and
#   `emailAddress=...,CN=rt-1` (short names OpenSSL and BoringSSL, which Envoy uses, print)
#   and RFC 4519's own `commonName=rt-1` raise ValueError: a valid certificate refused;
# - it takes a `#` hex string for the value's bytes, not its BER encoding: `CN=#040472742d31`
#   gives the CN "\x04\x04rt-1" where this parser refuses a CN that is not text.


def _attribute_type(s: _Scanner) -> str:
    s.skip_ows()
    start = s.pos
    while s.peek() and (s.peek().isascii() and (s.peek().isalnum() or s.peek() in "-.")):
        s.pos += 1
    name = s.text[start : s.pos]
    s.skip_ows()
    if not _valid_attribute_type(name) or s.peek() != "=":
        raise XfccMalformed("a Subject attribute type is not a descriptor or an OID")
    s.pos += 1
    s.skip_ows()
    return name


def _valid_attribute_type(name: str) -> bool:
    if name[:1].isascii() and name[:1].isalpha():
        return all(ch.isascii() and (ch.isalnum() or ch == "-") for ch in name)
    parts = name.split(".")
    return len(parts) >= 2 and all(
        p.isascii() and p.isdigit() and (p == "0" or not p.startswith("0")) for p in parts
    )


def _hexstring(s: _Scanner) -> str:
    s.pos += 1  # the '#'
    start = s.pos
    while s.peek() and s.peek() in _HEX:
        s.pos += 1
    digits = s.text[start : s.pos]
    if not digits or len(digits) % 2:
        raise XfccMalformed("a Subject hex string has an odd or empty number of digits")
    return digits


def _string_value(s: _Scanner) -> str:
    """An RFC 4514 `string`, unescaped. Unescaped spaces at either end are dropped, escaped
    ones kept, as the grammar allows spaces only as `\\ ` there."""
    out: list[str] = []
    pending = bytearray()  # consecutive hex pairs: UTF-8 bytes, decoded together
    kept = 0  # length of `out` that ends in an escaped or hex character: trailing spaces stay
    while True:
        ch = s.peek()
        if not ch or ch in ",+":
            break
        if ch == "\\":
            nxt = s.text[s.pos + 1 : s.pos + 3]
            if len(nxt) == 2 and nxt[0] in _HEX and nxt[1] in _HEX:
                pending.append(int(nxt, 16))
                s.pos += 3
                continue
            if _flush(pending, out):
                kept = len(out)
            if not nxt or nxt[0] not in _DN_ESCAPABLE:
                raise XfccMalformed("a Subject escape is neither a special character nor hex")
            out.append(nxt[0])
            kept = len(out)
            s.pos += 2
            continue
        if _flush(pending, out):
            kept = len(out)
        if ch in _DN_SPECIAL:
            raise XfccMalformed("a Subject value holds an unescaped special character")
        out.append(ch)
        s.pos += 1
    if _flush(pending, out):
        kept = len(out)
    while len(out) > kept and out[-1] in _OWS:
        out.pop()
    return "".join(out)


def _flush(pending: bytearray, out: list[str]) -> bool:
    """Decodes the collected hex pairs onto `out`; True when there were any."""
    if not pending:
        return False
    try:
        out.append(bytes(pending).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise XfccMalformed("a Subject hex escape is not UTF-8") from exc
    pending.clear()
    return True


def parse_dn(text: str) -> list[list[Attribute]]:
    """RDNs in the order written, each a list of its attributes (more than one with `+`)."""
    _check_characters(text)
    s = _Scanner(text)
    s.skip_ows()
    if s.at_end():
        return []
    rdns: list[list[Attribute]] = [[]]
    while True:
        name = _attribute_type(s)
        if s.peek() == "#":
            rdns[-1].append(Attribute(type=name, value=_hexstring(s), ber=True))
        else:
            rdns[-1].append(Attribute(type=name, value=_string_value(s)))
        s.skip_ows()
        if s.at_end():
            return rdns
        if s.peek() == ",":
            rdns.append([])
        elif s.peek() != "+":  # only after a hex string: `#04ab` followed by other text
            raise XfccMalformed("unexpected text in the Subject")
        s.pos += 1


def common_name(subject: str) -> str | None:
    """The Subject's one CN attribute; None without one. Several are ambiguous."""
    found = [
        attribute
        for rdn in parse_dn(subject)
        for attribute in rdn
        if attribute.type.lower() in CN_TYPES
    ]
    if len(found) > 1:
        raise XfccMalformed("the Subject has more than one CN", reason="ambiguous")
    if not found:
        return None
    if found[0].ber:
        # A hex value is BER, which Envoy never prints for a CN it can print as text.
        raise XfccMalformed("the Subject's CN is not text")
    return found[0].value


def forwarded(value: str) -> tuple[str | None, str | None]:
    """(CN, `Hash` value) of the certificate the last proxy verified (see the module docstring)."""
    last = parse_xfcc(value)[-1]
    subject = last.single("subject")
    return (None if subject is None else common_name(subject)), last.single("hash")


def normalise_hash(value: str | None) -> str | None:
    """The XFCC `Hash` value (the client certificate's SHA-256) in one form, lower-case hex, as
    the deny list holds it; None when it is not a SHA-256 hex."""
    if value is None:
        return None
    value = value.strip().lower()
    return value if _SHA256_HEX.fullmatch(value) else None


def identity_from_xfcc(headers: Mapping[str, str], *, runtime_id: str, trusted: bool) -> Identity:
    if not trusted:
        raise IdentityNotProven("client certificates are not trusted here", reason="xfcc-untrusted")
    value = headers.get(HEADER)
    if not value:
        raise IdentityNotProven("no forwarded client certificate", reason="missing")
    try:
        cn, certificate_hash = forwarded(value)
    except XfccMalformed as exc:
        raise IdentityNotProven(str(exc), reason=exc.reason) from exc
    if not cn:
        raise IdentityNotProven("forwarded certificate has no CN", reason="no-cn")
    if cn.lower() != runtime_id.lower():
        raise IdentityForbidden("certificate belongs to another runtime", reason="runtime-mismatch")
    return Identity(
        runtime_id=runtime_id,
        subject=f"CN={cn}",
        mode="xfcc",
        certificate_hash=normalise_hash(certificate_hash),
    )
