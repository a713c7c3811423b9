"""Pure rules for finding an approved issuer's keys (BYOC enrolment) by its OIDC discovery
document, and for the URLs that may be contacted for them.

What always holds:

- An issuer (or a `jwks_uri`) is an https URL of bounded length, printable ASCII without spaces,
  with a host, without user info, query, fragment or port 0, made only of letters, digits and
  `-._~:/%` (`issuer_problem`).
- The discovery document is fetched from the issuer's own `/.well-known/openid-configuration`;
  its `issuer` must be the same string and its `jwks_uri` must pass the same URL rules and be on
  the issuer's own host and port: an approval of one origin never sends the broker to another.

Which issuer is approved for a runtime is not decided here: BYOC enrolment
(`enrolment/enrolment_rules`) decides it and hands the approved issuer to
`JwksVerifier.verify_with_issuer`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

MAX_ISSUER_CHARS = 512  # cloud issuers are ~100 characters; an annotation value stays small
DISCOVERY_SUFFIX = "/.well-known/openid-configuration"
# What an issuer may be made of. The value comes from an unauthenticated caller and ends up in
# the approval command an operator pastes into a shell: `$`, backquotes, `;`, `|`, `&`, quotes,
# parentheses, brackets, braces and globs have no place in a cluster's issuer URL (cloud issuers
# are host names and path segments of letters, digits and `-._~`), so they are refused outright,
# not escaped. The command quotes its values as well (`enrolment_rules.approve_command`).
_ISSUER_CHARS = re.compile(r"[A-Za-z0-9._~:/%-]+")


def issuer_problem(value: object) -> str | None:
    """Why `value` cannot be an enrolled issuer, or None when it can."""
    if not isinstance(value, str) or not value:
        return "no issuer"
    if len(value) > MAX_ISSUER_CHARS:
        return f"longer than {MAX_ISSUER_CHARS} characters"
    if not value.isascii() or any(ch.isspace() or not ch.isprintable() for ch in value):
        return "not printable ASCII without spaces"
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return "not a URL"
    checks = (
        (parts.scheme != "https", "not https"),
        (not parts.hostname or "@" in parts.netloc, "no host, or user info in the URL"),
        ("?" in value or "#" in value, "a query or fragment in the URL"),
        (port == 0, "port 0"),
        (not _ISSUER_CHARS.fullmatch(value), "characters other than letters, digits and -._~:/%"),
    )
    return next((problem for failed, problem in checks if failed), None)


def discovery_url(issuer: str) -> str:
    return issuer.rstrip("/") + DISCOVERY_SUFFIX


class DiscoveryInvalid(ValueError):
    """The approved issuer's discovery document breaks the rules above."""


def jwks_uri_from_discovery(issuer: str, document: object) -> str:
    if not isinstance(document, Mapping):
        raise DiscoveryInvalid("the discovery document is not a JSON object")
    if document.get("issuer") != issuer:
        raise DiscoveryInvalid("the discovery document names another issuer")
    jwks_uri = document.get("jwks_uri")
    problem = issuer_problem(jwks_uri)
    if problem is not None:
        raise DiscoveryInvalid(f"jwks_uri is unusable: {problem}")
    assert isinstance(jwks_uri, str)
    mine, theirs = urlsplit(issuer), urlsplit(jwks_uri)
    if (mine.hostname, mine.port or 443) != (theirs.hostname, theirs.port or 443):
        raise DiscoveryInvalid("jwks_uri is not on the issuer's host and port")
    return jwks_uri
