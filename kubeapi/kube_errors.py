"""The errors of the Kubernetes layer, in one tree: what the agent and the broker's adapters
catch (the broker's request path has its own tree, `control_plane_broker.errors`, into which its
adapters translate these).

    KubeError(message, *, status=None)   anything that went wrong talking to an API server
    ├── KubeUnavailable   transport failure, 5xx, 429, an answer that is not what the API
    │                     promises (not JSON, a list without items): try again later
    ├── NotFound          404
    ├── Conflict          409 (AlreadyExists, or a stale resourceVersion on update)
    ├── Gone              410 (a watch's or a list's continue version is too old: re-list)
    └── KubeRejected      any other 4xx (RBAC, validation, admission): retrying will not help

    KubeconfigError(message, *, reason)  a kubeconfig that we refuse to use (a ValueError:
                                          bad input, not a failed call); `reason` is a slug

Always holds: messages name fields, never their values, so no token, key or kubeconfig text
ends up in a message, a log line or a traceback.
"""

from __future__ import annotations


class KubeError(Exception):
    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class KubeUnavailable(KubeError):
    pass


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Gone(KubeError):
    pass


class KubeRejected(KubeError):
    pass


class KubeconfigError(ValueError):
    """A kubeconfig we will not use. `reason` is stable (for metrics, Events and problem
    types): `not-yaml`, `too-large`, `not-a-mapping`, `no-context`, `no-cluster`, `no-server`,
    `not-https`, `bad-server`, `file-reference`, `token-file`, `exec-plugin`, `auth-provider`,
    `basic-auth`, `impersonation`, `insecure-skip-tls-verify`, `proxy`, `tls-server-name`,
    `bad-ca`, `bad-client-cert`, `bad-token`, `bad-base64`, `unknown-field`, `unreadable`,
    `no-in-cluster`."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


def error_for_status(status: int, message: str) -> KubeError:
    """The error for an HTTP status the API server answered with (>= 400)."""
    if status == 404:
        return NotFound(message, status=status)
    if status == 409:
        return Conflict(message, status=status)
    if status == 410:
        return Gone(message, status=status)
    if status == 429 or status >= 500:
        return KubeUnavailable(message, status=status)
    if status >= 400:
        return KubeRejected(message, status=status)
    # A non-error status where an error was announced (a watch ERROR event saying 200).
    return KubeUnavailable(message, status=status)
