"""ServiceAccount token claims (`identity.claims`)."""

from __future__ import annotations

import base64
import json

import pytest

from control_plane_broker import errors
from control_plane_broker.identity import claims

ALLOWED = frozenset({("kyma-system", "compass-agent")})


@pytest.mark.parametrize(
    ("username", "error"),
    [
        ("system:serviceaccount:kyma-system:compass-agent", None),
        ("system:serviceaccount:default:compass-agent", errors.IdentityForbidden),
        ("system:serviceaccount:kyma-system:other", errors.IdentityForbidden),
        ("admin", errors.IdentityForbidden),
        ("system:serviceaccount:kyma-system", errors.IdentityForbidden),
        ("system:serviceaccount:a:b:c", errors.IdentityForbidden),
    ],
)
def test_service_account_allow_list(username: str, error: type[Exception] | None) -> None:
    if error is None:
        assert claims.check_service_account(username, ALLOWED) == ("kyma-system", "compass-agent")
    else:
        with pytest.raises(error):
            claims.check_service_account(username, ALLOWED)


def test_audience() -> None:
    claims.check_audience(["x", "compass-broker"], "compass-broker")
    with pytest.raises(errors.IdentityNotProven):
        claims.check_audience(["https://kubernetes.default.svc"], "compass-broker")


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer abc", True),
        ("bearer abc", True),
        ("Basic abc", False),
        ("Bearer ", False),
        (None, False),
    ],
)
def test_bearer_token(header: str | None, ok: bool) -> None:
    if ok:
        assert claims.bearer_token(header) == "abc"
    else:
        with pytest.raises(errors.IdentityNotProven):
            claims.bearer_token(header)


def _jwt(payload: dict[str, object]) -> str:
    def part(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(payload)}.sig"


def test_cache_lifetime_bound_by_token_expiry_and_maximum() -> None:
    assert claims.unverified_expiry(_jwt({"exp": 1234})) == 1234.0
    assert claims.unverified_expiry("garbage") is None
    assert claims.cache_until(now=0, token_expiry=50, max_seconds=600) == 50
    assert claims.cache_until(now=0, token_expiry=5000, max_seconds=600) == 600
    assert claims.cache_until(now=0, token_expiry=None, max_seconds=600) == 600


def test_fingerprint_binds_runtime_and_hides_token() -> None:
    a = claims.token_fingerprint("rt-a", "secret-token")
    assert a != claims.token_fingerprint("rt-b", "secret-token")
    assert "secret-token" not in a
