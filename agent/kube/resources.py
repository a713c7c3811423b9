"""API paths of the objects the agent reads and writes; one place, no I/O."""

from __future__ import annotations

KYMA_GROUP_VERSION = "operator.kyma-project.io/v1beta2"
APPLICATION_CONNECTOR_GROUP_VERSION = "operator.kyma-project.io/v1alpha1"
COMPASS_CONNECTION_GROUP_VERSION = "compass.kyma-project.io/v1alpha1"
COMPASS_CONNECTION_NAME = "compass-connection"


def kymas(namespace: str) -> str:
    return f"/apis/{KYMA_GROUP_VERSION}/namespaces/{namespace}/kymas"


def application_connectors(namespace: str) -> str:
    return (
        f"/apis/{APPLICATION_CONNECTOR_GROUP_VERSION}/namespaces/{namespace}/applicationconnectors"
    )


def compass_connections() -> str:
    return f"/apis/{COMPASS_CONNECTION_GROUP_VERSION}/compassconnections"


def configmaps(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps"


def deployments(namespace: str) -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/deployments"


def secrets(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/secrets"


def events(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/events"


def token_request(namespace: str, service_account: str) -> str:
    return f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
