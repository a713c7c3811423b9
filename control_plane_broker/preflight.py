"""`compass-broker --check-config`: asks every server the broker needs to serve whether it would
work with these settings, and says whom it asked and what came back.

Holds: KCP (the Kyma and mapping collections in BROKER_KCP_NAMESPACE: access, RBAC, the mapping
CRD), Director's OAuth token endpoint (the credentials) and Director itself (the token accepted)
are each contacted once, with the timeouts serving uses; every contact gives one line, `ok:` or
`FAILED:`, naming the server; nothing is written anywhere and no one-time token is requested.
Serving does not contact anything before it starts: a Compass that is down only delays tokens,
so it must not keep the broker from starting; this check is for the operator who asks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from control_plane_broker.director.classification import DirectorPermanent, DirectorRetryable
from control_plane_broker.director.oauth import OAuthTokenSource
from control_plane_broker.kyma import KYMA_GROUP, KYMA_VERSION, MAPPING_VERSION
from control_plane_broker.settings import Settings, load_director_credentials
from kubeapi import ClusterAccess, KubeClient, KubeError, NotFound, describe_transport_error


@dataclass(frozen=True)
class Contact:
    ok: bool
    server: str  # what was asked: "KCP https://10.0.0.1:6443"
    said: str  # what came back, in an operator's words

    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAILED'}: {self.server}: {self.said}"


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


async def check_kcp(settings: Settings, access: ClusterAccess) -> Contact:
    ns = settings.kcp_namespace
    server = f"KCP {_origin(access.server)}"
    collections = {
        "kymas": f"/apis/{KYMA_GROUP}/{KYMA_VERSION}/namespaces/{ns}/kymas",
        "compassmanagermappings": (
            f"/apis/{KYMA_GROUP}/{MAPPING_VERSION}/namespaces/{ns}/compassmanagermappings"
        ),
    }
    async with KubeClient(access, user_agent="compass-broker-check", timeout=10.0) as kcp:
        for name, path in collections.items():
            try:
                await kcp.get(path, params={"limit": "1"})
            except NotFound:
                return Contact(False, server, f"{name} unknown: is its CRD installed?")
            except KubeError as exc:
                return Contact(False, server, f"cannot list {name} in {ns}: {exc.message}")
    return Contact(True, server, f"listed kymas and compassmanagermappings in {ns}")


async def check_director(settings: Settings) -> list[Contact]:
    assert settings.director_credentials_file is not None  # checked before (serving_problems)
    credentials = load_director_credentials(settings.director_credentials_file)
    oauth_server = f"OAuth token endpoint {_origin(credentials.tokens_endpoint)}"
    director_server = f"Director {_origin(settings.director_url)}"
    timeout = httpx.Timeout(settings.director_timeout_seconds)
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as http:
        oauth = OAuthTokenSource(
            http, credentials, scope=settings.director_scope, clock=time.monotonic
        )
        try:
            token = await oauth.token()
        except (DirectorRetryable, DirectorPermanent) as exc:
            return [
                Contact(False, oauth_server, str(exc)),
                Contact(False, director_server, "not asked: no access token"),
            ]
        contacts = [
            Contact(True, oauth_server, f"access token issued to client {credentials.client_id}")
        ]
        try:
            # The cheapest query there is: it proves the endpoint and that the token is taken.
            answer = await http.post(
                settings.director_url,
                json={"query": "query { __typename }"},
                headers={"Authorization": f"Bearer {token}"},
            )
        except httpx.HTTPError as exc:
            contacts.append(Contact(False, director_server, describe_transport_error(exc)))
            return contacts
    if answer.status_code in (401, 403):
        contacts.append(
            Contact(False, director_server, f"refused the access token (HTTP {answer.status_code})")
        )
    elif answer.status_code in (404, 405):
        contacts.append(
            Contact(
                False,
                director_server,
                f"no GraphQL endpoint at this URL (HTTP {answer.status_code})",
            )
        )
    elif answer.status_code >= 500:
        contacts.append(Contact(False, director_server, f"failed (HTTP {answer.status_code})"))
    else:
        contacts.append(Contact(True, director_server, f"answered HTTP {answer.status_code}"))
    return contacts


async def check(settings: Settings, access: ClusterAccess) -> list[Contact]:
    return [await check_kcp(settings, access), *await check_director(settings)]
