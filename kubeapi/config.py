"""Where an API server is and how we prove who we are to it: `ClusterAccess`, and its loaders.

Three ways in, one parser:

- `access_from_untrusted_kubeconfig(text)`: a kubeconfig someone else wrote (a runtime's
  kubeconfig Secret in KCP). Its writer must not be able to make us read a local file, run a
  command, send our credentials elsewhere or connect without verifying the server. Accepted
  in the selected cluster and user, and nothing else: `server` (https only),
  `certificate-authority-data`, `client-certificate-data` + `client-key-data`, `token`, plus
  `insecure-skip-tls-verify: false`, `disable-compression` and `extensions`, which change
  nothing. `tls-server-name` is refused too: it picks which certificate name we accept for
  the server, and the kubeconfigs KCP holds never need it. Anything else in a cluster or a
  user is refused with a `KubeconfigError` whose `reason` says which rule it broke
  (`unknown-field` for names we do not know, so a future field fails closed).
- `access_from_kubeconfig_file(path)`: the process's own kubeconfig (an operator's, the
  devenv's). File references (`certificate-authority`, `client-certificate`, `client-key`)
  and `tokenFile` are allowed, relative to the file; commands, plugins, proxies, basic auth
  and skipping TLS verification are still refused.
- `in_cluster_access()`: the pod's ServiceAccount; `load_access` picks one of the last two.

Always holds: a `ClusterAccess` was checked when it was made — CA, certificate and key parse,
and the SSL context is built once, eagerly, so bad material is a `KubeconfigError` here and
never an `ssl.SSLError` at the first request; no kubeconfig needs a CA file (without CA data
the system trust store verifies the server); its repr shows no secret; errors name fields,
never values (and are raised `from None`, so no YAML snippet rides along in a traceback).
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from kubeapi.kube_errors import KubeconfigError, KubeUnavailable

IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_KUBECONFIG_CHARS = 1 << 20  # real kubeconfigs are a few KiB; this bounds YAML work

# Cluster and user fields, and what they mean for a kubeconfig we did not write.
_HARMLESS = frozenset({"extensions", "disable-compression"})
_CLUSTER_REFUSED = {
    "certificate-authority": "file-reference",
    "proxy-url": "proxy",
    "tls-server-name": "tls-server-name",
}
_USER_REFUSED = {
    "client-certificate": "file-reference",
    "client-key": "file-reference",
    "tokenFile": "token-file",
    "exec": "exec-plugin",
    "auth-provider": "auth-provider",
    "username": "basic-auth",
    "password": "basic-auth",
    "as": "impersonation",
    "as-uid": "impersonation",
    "as-groups": "impersonation",
    "as-user-extra": "impersonation",
}
# What one's own kubeconfig may use on top of what an untrusted one may.
_OWN_FILES = frozenset({"certificate-authority", "client-certificate", "client-key", "tokenFile"})
_CLUSTER_KNOWN = frozenset(
    {"server", "certificate-authority-data", "insecure-skip-tls-verify"}
    | _HARMLESS
    | _CLUSTER_REFUSED.keys()
)
_USER_KNOWN = frozenset(
    {"token", "client-certificate-data", "client-key-data"} | _HARMLESS | _USER_REFUSED.keys()
)


@dataclass(frozen=True)
class ClusterAccess:
    server: str
    ca_pem: bytes | None = None
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    token: str | None = None
    token_file: Path | None = None
    _ssl: ssl.SSLContext | None = field(default=None, init=False, repr=False, compare=False)

    def __repr__(self) -> str:
        auth = [
            name
            for name, value in (
                ("token", self.token),
                ("token-file", self.token_file),
                ("client-certificate", self.client_cert_pem),
            )
            if value
        ]
        return f"ClusterAccess(server={self.server!r}, auth={'+'.join(auth) or 'none'})"

    def ssl_context(self) -> ssl.SSLContext:
        """The context that verifies the server and presents our certificate; built once."""
        if self._ssl is None:
            object.__setattr__(self, "_ssl", _build_ssl_context(self))
        assert self._ssl is not None
        return self._ssl

    def bearer(self) -> str | None:
        """The bearer token; a token file is re-read every time (the kubelet rotates it)."""
        if self.token:
            return self.token
        if self.token_file is None:
            return None
        try:
            return self.token_file.read_text().strip() or None
        except OSError as exc:
            # Mid-rotation or a volume not mounted yet: temporary, like an unreachable server.
            raise KubeUnavailable(f"cannot read the token file: {exc.strerror}") from None


def _build_ssl_context(access: ClusterAccess) -> ssl.SSLContext:
    if access.ca_pem is not None:
        try:
            text = access.ca_pem.decode("ascii")
        except UnicodeDecodeError:
            raise KubeconfigError("the CA is not PEM text", reason="bad-ca") from None
        if "-----BEGIN CERTIFICATE-----" not in text:
            raise KubeconfigError("the CA holds no PEM certificate", reason="bad-ca")
        try:
            context = ssl.create_default_context(cadata=text)
        except (ssl.SSLError, ValueError):
            raise KubeconfigError("the CA does not parse", reason="bad-ca") from None
    else:
        context = ssl.create_default_context()
    if access.client_cert_pem is not None and access.client_key_pem is not None:
        _load_cert_chain(context, access.client_cert_pem, access.client_key_pem)
    return context


def _no_password() -> bytes:
    # Without a password callback OpenSSL would prompt on the terminal for an encrypted key.
    return b""


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ssl loads a certificate chain only from a file: a private file that lives for this call.
    with tempfile.TemporaryDirectory(prefix="kubeapi-tls-") as folder:
        path = Path(folder) / "client.pem"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(cert.rstrip(b"\n") + b"\n" + key)
        try:
            context.load_cert_chain(str(path), password=_no_password)
        except (ssl.SSLError, ValueError):
            raise KubeconfigError(
                "the client certificate and key do not parse or do not match",
                reason="bad-client-cert",
            ) from None


# -- parsing ---------------------------------------------------------------------------------


def _entry(doc: Mapping[str, Any], kind: str, name: object, reason: str) -> Mapping[str, Any]:
    """`doc[kind + 's']`'s entry called `name`, e.g. the cluster of the selected context."""
    items = doc.get(f"{kind}s")
    if isinstance(name, str) and isinstance(items, list):
        for item in items:
            if isinstance(item, Mapping) and item.get("name") == name:
                value = item.get(kind)
                if isinstance(value, Mapping):
                    return value
                if value is None and kind == "user":
                    return {}
                raise KubeconfigError(f"the {kind} entry is not a mapping", reason="not-a-mapping")
    raise KubeconfigError(f"the selected context names no existing {kind}", reason=reason)


def _select_context(doc: Mapping[str, Any], wanted: str | None) -> Mapping[str, Any]:
    name = wanted or doc.get("current-context")
    contexts = doc.get("contexts")
    if not name and isinstance(contexts, list) and len(contexts) == 1:
        only = contexts[0]
        name = only.get("name") if isinstance(only, Mapping) else None
    if not name:
        raise KubeconfigError("no context is selected", reason="no-context")
    return _entry(doc, "context", name, "no-context")


def _refuse_fields(entry: Mapping[str, Any], *, what: str, own: bool) -> None:
    known = _CLUSTER_KNOWN if what == "cluster" else _USER_KNOWN
    refused = _CLUSTER_REFUSED if what == "cluster" else _USER_REFUSED
    for key in sorted(str(k) for k in entry):
        value = entry.get(key)
        if key not in known:
            raise KubeconfigError(f"unknown {what} field {key!r}", reason="unknown-field")
        if key == "insecure-skip-tls-verify":
            if value not in (None, False):
                raise KubeconfigError(
                    "skipping TLS verification is not allowed", reason="insecure-skip-tls-verify"
                )
        elif key in refused and value is not None and not (own and key in _OWN_FILES):
            raise KubeconfigError(f"{what} field {key!r} is not allowed", reason=refused[key])


def _text(entry: Mapping[str, Any], key: str) -> str | None:
    value = entry.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise KubeconfigError(f"{key} is not a string", reason="not-a-mapping")
    return value


def _base64(entry: Mapping[str, Any], key: str) -> bytes | None:
    value = _text(entry, key)
    if value is None:
        return None
    try:
        return base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise KubeconfigError(f"{key} is not base64", reason="bad-base64") from None


def _file(entry: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    value = _text(entry, key)
    if value is None:
        return None
    path = (base / value).expanduser()
    try:
        return path.read_bytes()
    except OSError as exc:
        raise KubeconfigError(f"{key} {path}: {exc.strerror}", reason="unreadable") from None


def _server(cluster: Mapping[str, Any]) -> str:
    raw = _text(cluster, "server")
    if raw is None:
        raise KubeconfigError("the cluster has no server", reason="no-server")
    try:
        url = httpx.URL(raw)
    except (httpx.InvalidURL, ValueError, TypeError):
        raise KubeconfigError("the server is not a URL", reason="bad-server") from None
    if url.scheme != "https":
        raise KubeconfigError("the server must be an https:// URL", reason="not-https")
    if not url.host or url.userinfo or url.query or url.fragment:
        raise KubeconfigError(
            "the server URL must be https://host[:port][/path] only", reason="bad-server"
        )
    return raw.rstrip("/")


def _token(user: Mapping[str, Any]) -> str | None:
    token = _text(user, "token")
    # Visible ASCII only: anything else would break (or inject into) the Authorization header.
    if token is not None and not all(0x21 <= ord(c) <= 0x7E for c in token):
        raise KubeconfigError("the token has characters a header cannot carry", reason="bad-token")
    return token


def _access_from_document(doc: object, *, context: str | None, base: Path | None) -> ClusterAccess:
    """One parser for both trust levels: `base` is the own kubeconfig's folder, None for one
    written by someone else (then no file of ours may be named)."""
    if not isinstance(doc, Mapping):
        raise KubeconfigError("the kubeconfig is not a mapping", reason="not-a-mapping")
    selected = _select_context(doc, context)
    cluster = _entry(doc, "cluster", selected.get("cluster"), "no-cluster")
    user = _entry(doc, "user", selected["user"], "no-user") if selected.get("user") else {}
    own = base is not None
    _refuse_fields(cluster, what="cluster", own=own)
    _refuse_fields(user, what="user", own=own)
    server = _server(cluster)
    ca = _base64(cluster, "certificate-authority-data")
    cert = _base64(user, "client-certificate-data")
    key = _base64(user, "client-key-data")
    token_file: Path | None = None
    if base is not None:
        ca = ca or _file(cluster, "certificate-authority", base)
        cert = cert or _file(user, "client-certificate", base)
        key = key or _file(user, "client-key", base)
        if _text(user, "tokenFile"):
            _file(user, "tokenFile", base)  # readable now, re-read for every request later
            token_file = base / str(user["tokenFile"])
    if (cert is None) != (key is None):
        raise KubeconfigError(
            "a client certificate needs its key and a key its certificate",
            reason="bad-client-cert",
        )
    access = ClusterAccess(
        server=server,
        ca_pem=ca,
        client_cert_pem=cert,
        client_key_pem=key,
        token=_token(user),
        token_file=token_file,
    )
    access.ssl_context()  # bad CA, certificate or key fail here, not at the first request
    return access


def _load_yaml(text: str) -> object:
    if len(text) > MAX_KUBECONFIG_CHARS:
        raise KubeconfigError("the kubeconfig is too large", reason="too-large")
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError):
        raise KubeconfigError("the kubeconfig is not YAML", reason="not-yaml") from None


def access_from_untrusted_kubeconfig(text: str) -> ClusterAccess:
    """Access from a kubeconfig someone else wrote; refuses all but the fields listed above."""
    return _access_from_document(_load_yaml(text), context=None, base=None)


def access_from_kubeconfig_file(path: Path | str, *, context: str | None = None) -> ClusterAccess:
    """Access from the process's own kubeconfig; file references are relative to it."""
    file = Path(path).expanduser()
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        message = getattr(exc, "strerror", None) or "not text"
        raise KubeconfigError(f"kubeconfig {file}: {message}", reason="unreadable") from None
    return _access_from_document(_load_yaml(text), context=context, base=file.parent)


def in_cluster_access(
    environ: Mapping[str, str] | None = None, *, folder: Path = IN_CLUSTER_DIR
) -> ClusterAccess:
    """The pod's own ServiceAccount: the API server's Service, its CA and the rotating token."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeconfigError(
            "not in a pod (KUBERNETES_SERVICE_HOST is unset) and no kubeconfig given",
            reason="no-in-cluster",
        )
    if ":" in host:
        host = f"[{host}]"
    try:
        ca = (folder / "ca.crt").read_bytes()
    except OSError as exc:
        raise KubeconfigError(
            f"{folder / 'ca.crt'}: {exc.strerror}", reason="no-in-cluster"
        ) from None
    access = ClusterAccess(server=f"https://{host}:{port}", ca_pem=ca, token_file=folder / "token")
    access.ssl_context()
    return access


def load_access(kubeconfig: str | None) -> ClusterAccess:
    """The first file of a KUBECONFIG-style list when given, else the in-cluster account."""
    first = next((p for p in (kubeconfig or "").split(os.pathsep) if p), None)
    if first is not None:
        return access_from_kubeconfig_file(first)
    return in_cluster_access()
