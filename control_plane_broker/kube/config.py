"""Cluster access from a kubeconfig document or the in-cluster ServiceAccount.

`access_from_kubeconfig` is pure (a parsed document in, a `ClusterAccess` out); credentials stay
in memory except for the moment `ssl` needs a client key as a file (a private temp file that is
removed at once). Supported: certificate-authority(-data), client-certificate/key(-data), token,
token-file, insecure-skip-tls-verify. Exec and auth-provider plugins are not supported.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used; the message never contains credential material."""


@dataclass(frozen=True)
class ClusterAccess:
    server: str
    ca_pem: bytes | None = None
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    token: str | None = None
    token_file: Path | None = None
    insecure: bool = False

    def __repr__(self) -> str:
        return f"ClusterAccess(server={self.server!r})"

    def ssl_context(self) -> ssl.SSLContext:
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_pem is not None:
            ctx = ssl.create_default_context(cadata=self.ca_pem.decode())
        else:
            ctx = ssl.create_default_context()
        if self.client_cert_pem and self.client_key_pem:
            _load_cert_chain(ctx, self.client_cert_pem, self.client_key_pem)
        return ctx

    def bearer(self) -> str | None:
        if self.token:
            return self.token
        if self.token_file is not None:
            # Projected tokens rotate: read the file each time a client needs it.
            return self.token_file.read_text().strip()
        return None


def _load_cert_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="broker-tls-") as tmp:
        path = Path(tmp) / "client.pem"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(cert.rstrip(b"\n") + b"\n" + key)
        ctx.load_cert_chain(str(path))


def _pick(items: list[dict[str, Any]], name: str, what: str) -> dict[str, Any]:
    for item in items or []:
        if item.get("name") == name:
            value = item.get(what)
            if isinstance(value, dict):
                return value
    raise KubeconfigError(f"kubeconfig has no {what} named {name!r}")


def _data_or_file(entry: dict[str, Any], key: str, base: Path | None) -> bytes | None:
    data = entry.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(data)
        except ValueError as exc:
            raise KubeconfigError(f"{key}-data is not base64") from exc
    path = entry.get(key)
    if path:
        p = Path(path)
        if not p.is_absolute() and base is not None:
            p = base / p
        return p.read_bytes()
    return None


def access_from_kubeconfig(doc: Any, *, base_dir: Path | None = None) -> ClusterAccess:
    if not isinstance(doc, dict):
        raise KubeconfigError("kubeconfig is not a mapping")
    context_name = doc.get("current-context")
    contexts = doc.get("contexts") or []
    if not context_name and len(contexts) == 1:
        context_name = contexts[0].get("name")
    if not context_name:
        raise KubeconfigError("kubeconfig has no current-context")
    context = _pick(contexts, context_name, "context")
    cluster = _pick(doc.get("clusters") or [], context.get("cluster", ""), "cluster")
    user = (
        _pick(doc.get("users") or [], context.get("user", ""), "user")
        if context.get("user")
        else {}
    )
    if "exec" in user or "auth-provider" in user:
        raise KubeconfigError("exec and auth-provider kubeconfig users are not supported")
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeconfigError("kubeconfig cluster has no usable server URL")
    token_file = user.get("tokenFile")
    return ClusterAccess(
        server=server.rstrip("/"),
        ca_pem=_data_or_file(cluster, "certificate-authority", base_dir),
        client_cert_pem=_data_or_file(user, "client-certificate", base_dir),
        client_key_pem=_data_or_file(user, "client-key", base_dir),
        token=user.get("token") or None,
        token_file=Path(token_file) if token_file else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
    )


def access_from_kubeconfig_text(text: str) -> ClusterAccess:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KubeconfigError("kubeconfig is not valid YAML") from exc
    return access_from_kubeconfig(doc)


def load_kcp_access(environ: dict[str, str] | None = None) -> ClusterAccess:
    """KCP access: `KUBECONFIG` (first file) when set, else the in-cluster ServiceAccount."""
    env = dict(os.environ) if environ is None else environ
    kubeconfig = env.get("KUBECONFIG", "").split(os.pathsep)[0]
    if kubeconfig:
        path = Path(kubeconfig).expanduser()
        return access_from_kubeconfig(yaml.safe_load(path.read_text()), base_dir=path.parent)
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeconfigError("neither KUBECONFIG nor in-cluster configuration is available")
    if ":" in host:
        host = f"[{host}]"
    return ClusterAccess(
        server=f"https://{host}:{port}",
        ca_pem=(IN_CLUSTER_DIR / "ca.crt").read_bytes(),
        token_file=IN_CLUSTER_DIR / "token",
    )
