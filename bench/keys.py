"""One ServiceAccount signing key per simulated runtime, its JWKS, and the tokens it signs.

Holds: every runtime has its own key pair and `kid`, so a token of one runtime never verifies
for another; tokens look like a kubelet's projected ServiceAccount tokens (iss, sub, aud, exp,
nbf, iat, kubernetes.io claims) and carry the issuer the broker expects for that runtime.
EC P-256 (ES256) keys, because generating thousands of RSA keys would take minutes; the broker
accepts both.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

AGENT_NAMESPACE = "kyma-system"
AGENT_SERVICE_ACCOUNT = "compass-agent"
AUDIENCE = "compass-broker"


@dataclass(frozen=True)
class RuntimeKey:
    runtime_id: str
    kid: str
    private_key: ec.EllipticCurvePrivateKey = field(repr=False)

    def public_jwk(self) -> dict[str, Any]:
        jwk: dict[str, Any] = ECAlgorithm.to_jwk(self.private_key.public_key(), as_dict=True)
        jwk.update({"kid": self.kid, "use": "sig", "alg": "ES256"})
        return jwk


def new_runtime_keys(count: int) -> list[RuntimeKey]:
    """`count` runtimes with fresh IDs (upper-case UUIDs, like KEB's) and fresh keys."""
    return [
        RuntimeKey(
            runtime_id=str(uuid.uuid4()).upper(),
            kid=uuid.uuid4().hex[:16],
            private_key=ec.generate_private_key(ec.SECP256R1()),
        )
        for _ in range(count)
    ]


def issuer_for(issuer_template: str, runtime_id: str) -> str:
    """The issuer the broker derives from `BROKER_JWKS_ISSUER_URL` for this runtime."""
    return issuer_template.format(runtime_id=runtime_id)


def sign_token(
    key: RuntimeKey,
    *,
    issuer: str,
    audience: str = AUDIENCE,
    lifetime: float = 3600.0,
    now: float | None = None,
) -> str:
    issued = int(time.time() if now is None else now)
    subject = f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SERVICE_ACCOUNT}"
    claims = {
        "iss": issuer,
        "sub": subject,
        "aud": [audience],
        "iat": issued,
        "nbf": issued,
        "exp": issued + int(lifetime),
        "kubernetes.io": {
            "namespace": AGENT_NAMESPACE,
            "serviceaccount": {"name": AGENT_SERVICE_ACCOUNT, "uid": str(uuid.uuid4())},
        },
    }
    return jwt.encode(claims, key.private_key, algorithm="ES256", headers={"kid": key.kid})
