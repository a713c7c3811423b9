"""Pure identity checks: no I/O, no clock of their own.

What always holds: a caller is accepted only as a ServiceAccount on the allow-list, with the
configured audience, before expiry; the functions raise `IdentityNotProven` (401) when the
proof itself fails and `IdentityForbidden` (403) when it holds but is not allowed, or is
a valid-looking ServiceAccount token of another cluster.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import jwt

from control_plane_broker.errors import IdentityForbidden, IdentityNotProven

IdentityError = IdentityNotProven | IdentityForbidden

SA_PREFIX = "system:serviceaccount:"
# What a Kubernetes API server signs ServiceAccount tokens with (by the key's type and curve).
SA_ALGORITHMS = frozenset({"RS256", "ES256", "ES384", "ES512"})
# What a token is verified with against an issuer's published keys (jwks mode, BYOC enrolment):
# one list for both, so a token enrolment accepts is one the jwks proof can verify.
ISSUER_KEY_ALGORITHMS = ("RS256", "ES256")


@dataclass(frozen=True)
class Identity:
    runtime_id: str
    subject: str  # e.g. system:serviceaccount:kyma-system/compass-agent, or the certificate CN
    mode: str
    expires_at: float | None = None
    # xfcc mode: the SHA-256 hash of the client certificate (`Hash=`, lower-case hex), for the
    # deny list; None when the gateway sent none or in the other modes.
    certificate_hash: str | None = None


def parse_service_account(username: str) -> tuple[str, str]:
    """`system:serviceaccount:<ns>:<name>` → (ns, name); anything else is not a ServiceAccount."""
    if not username.startswith(SA_PREFIX):
        raise IdentityForbidden("the token does not belong to a ServiceAccount", reason="not-sa")
    namespace, sep, name = username[len(SA_PREFIX) :].partition(":")
    if not sep or not namespace or not name or ":" in name:
        raise IdentityForbidden("malformed ServiceAccount name", reason="not-sa")
    return namespace, name


def check_service_account(username: str, allowed: frozenset[tuple[str, str]]) -> tuple[str, str]:
    namespace, name = parse_service_account(username)
    if (namespace, name) not in allowed:
        raise IdentityForbidden(
            f"ServiceAccount {namespace}/{name} is not allowed", reason="sa-not-allowed"
        )
    return namespace, name


def check_audience(audiences: Iterable[str], expected: str) -> None:
    if expected not in set(audiences):
        raise IdentityNotProven("the token lacks the expected audience", reason="audience")


def unverified_expiry(token: str) -> float | None:
    """The `exp` claim read without checking the signature: used only to bound cache lifetimes."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    exp = claims.get("exp")
    return float(exp) if isinstance(exp, int | float) else None


def refusal_for_foreign_token(token: str, *, audience: str, now: float) -> IdentityError:
    """The refusal for a token that this runtime's cluster did not accept.

    Read from the unverified claims, so it only chooses *which* refusal to give, never
    whether to accept: a well-formed, unexpired ServiceAccount token for our audience that
    the runtime's own cluster rejects was issued by another cluster (or forged), which is
    an identity, just not this runtime's: 403. Anything less is no identity at all: 401.
    """
    try:
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return IdentityNotProven("not a JWT", reason="malformed")
    exp = unverified.get("exp")
    if not isinstance(exp, int | float) or exp <= now:
        return IdentityNotProven("the token has expired", reason="expired")
    aud = unverified.get("aud")
    if audience not in ([aud] if isinstance(aud, str) else aud or []):
        return IdentityNotProven("the token lacks the expected audience", reason="audience")
    if not str(unverified.get("sub", "")).startswith(SA_PREFIX):
        return IdentityNotProven("not a ServiceAccount token", reason="not-sa")
    return IdentityForbidden(
        "the token was not issued by this runtime's cluster", reason="other-cluster"
    )


def token_fingerprint(runtime_id: str, token: str) -> str:
    """Cache key: bound to the runtime, so a verdict for cluster A never serves cluster B."""
    return hashlib.sha256(f"{runtime_id}\0{token}".encode()).hexdigest()


def bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise IdentityNotProven("no Authorization header", reason="missing")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise IdentityNotProven("Authorization is not a bearer token", reason="malformed")
    if len(token) > 16384:
        raise IdentityNotProven("bearer token too long", reason="malformed")
    return token


def cache_until(*, now: float, token_expiry: float | None, max_seconds: float) -> float:
    """A verdict lives until the token expires, and never longer than `max_seconds`."""
    bound = now + max_seconds
    return bound if token_expiry is None else min(bound, token_expiry)


def screen_bearer(token: str, *, audience: str, now: float, leeway: float = 5.0) -> None:
    """Refuses, from the token alone, a bearer that cannot be a ServiceAccount token for us:
    not a JWT, an algorithm no API server signs with, not our audience, expired or without an
    expiry, not a ServiceAccount. Read unverified, so it only ever refuses, never accepts; it
    runs before anything that costs a request (a TokenReview, a key fetch, a Secret read), and
    before the runtime ID is looked at, so its answer is the same for every runtime ID."""
    try:
        header = jwt.get_unverified_header(token)
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        raise IdentityNotProven("not a JWT", reason="malformed") from None
    if header.get("alg") not in SA_ALGORITHMS:
        raise IdentityNotProven("unsupported signature algorithm", reason="algorithm")
    exp = unverified.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int | float) or exp + leeway <= now:
        raise IdentityNotProven("the token has expired", reason="expired")
    aud = unverified.get("aud")
    listed = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    check_audience([a for a in listed if isinstance(a, str)], audience)
    if not str(unverified.get("sub", "")).startswith(SA_PREFIX):
        raise IdentityNotProven("not a ServiceAccount token", reason="not-sa")
