"""Which refusal a token gets when the runtime's own cluster does not accept it."""

from __future__ import annotations

import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from control_plane_broker.errors import IdentityForbidden, IdentityNotProven
from control_plane_broker.identity.claims import refusal_for_foreign_token

NOW = 1_800_000_000.0
KEY = ec.generate_private_key(ec.SECP256R1())
SA = "system:serviceaccount:kyma-system:compass-agent"


def _token(**claims: object) -> str:
    body = {"sub": SA, "aud": ["compass-broker"], "exp": NOW + 600, "iss": "https://b"} | claims
    return jwt.encode(body, KEY, algorithm="ES256")


@pytest.mark.parametrize(
    ("token", "error", "reason"),
    [
        (_token(), IdentityForbidden, "other-cluster"),
        (_token(aud="compass-broker"), IdentityForbidden, "other-cluster"),
        (_token(exp=NOW - 1), IdentityNotProven, "expired"),
        (_token(exp=None), IdentityNotProven, "expired"),
        (_token(aud=["https://kubernetes.default.svc"]), IdentityNotProven, "audience"),
        (_token(sub="admin"), IdentityNotProven, "not-sa"),
        ("garbage.not.a-token", IdentityNotProven, "malformed"),
    ],
)
def test_refusal_for_foreign_token(token: str, error: type[Exception], reason: str) -> None:
    refusal = refusal_for_foreign_token(token, audience="compass-broker", now=NOW)
    assert type(refusal) is error
    assert refusal.reason == reason
    assert token not in str(refusal)


def test_real_clock_is_not_needed() -> None:
    # `now` is an argument: a token fresh by the wall clock but stale at `now` is expired.
    fresh = _token(exp=time.time() + 600)
    assert (
        refusal_for_foreign_token(fresh, audience="compass-broker", now=time.time() + 3600).reason
        == "expired"
    )
