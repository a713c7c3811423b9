"""Talking to Compass Director: GraphQL documents, typed models, OAuth, and the async client."""

from control_plane_broker.director.answers import (
    DirectorRuntime,
    OneTimeToken,
    RuntimeRegisterInput,
)
from control_plane_broker.director.classification import (
    DirectorNotFound,
    DirectorPermanent,
    DirectorRetryable,
    classify,
)
from control_plane_broker.director.graphql_client import DirectorClient
from control_plane_broker.director.oauth import OAuthTokenSource

__all__ = [
    "DirectorClient",
    "DirectorNotFound",
    "DirectorPermanent",
    "DirectorRetryable",
    "DirectorRuntime",
    "OAuthTokenSource",
    "OneTimeToken",
    "RuntimeRegisterInput",
    "classify",
]
