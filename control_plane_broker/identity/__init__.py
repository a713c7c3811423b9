"""Cluster identity: who is asking. Pure checks in `claims`; one adapter per proof mode."""

from control_plane_broker.identity.claims import Identity
from control_plane_broker.identity.jwks import JwksVerifier
from control_plane_broker.identity.tokenreview import TokenReviewVerifier
from control_plane_broker.identity.verifier import CountingVerifier, Verifier, XfccVerifier

__all__ = [
    "CountingVerifier",
    "Identity",
    "JwksVerifier",
    "TokenReviewVerifier",
    "Verifier",
    "XfccVerifier",
]
