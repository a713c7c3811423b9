"""Kubeconfig loaders: what an untrusted kubeconfig may say, what one's own may add, and that
every refusal is a typed `KubeconfigError` made before anything connects anywhere."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv import pki
from kubeapi import (
    ClusterAccess,
    KubeconfigError,
    KubeUnavailable,
    access_from_kubeconfig_file,
    access_from_untrusted_kubeconfig,
    in_cluster_access,
    load_access,
)

CA = pki.new_ca("test-ca")
CLIENT = pki.issue(CA, common_name="admin", client=True)
OTHER_CLIENT = pki.issue(pki.new_ca("other"), common_name="x", client=True)
SECRET_TOKEN = "s3cr3t-t0ken-value"


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def kubeconfig(
    cluster: dict[str, Any] | None = None, user: dict[str, Any] | None = None, **top: Any
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": "https://127.0.0.1:6443",
                    "certificate-authority-data": b64(CA.cert_pem),
                    **(cluster or {}),
                },
            }
        ],
        "users": [{"name": "u", "user": {"token": SECRET_TOKEN, **(user or {})}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    doc.update(top)
    return doc


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A server the refused kubeconfigs point at: nothing may ever connect to it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def connections(sock: socket.socket) -> int:
    count = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


REFUSED: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    # id, cluster fields, user fields, reason
    ("ca-file", {"certificate-authority": "/etc/ssl/ca.pem"}, {}, "file-reference"),
    (
        "client-cert-file",
        {},
        {"client-certificate": "/x.crt", "client-key-data": "eA=="},
        "file-reference",
    ),
    ("client-key-file", {}, {"client-key": "/x.key"}, "file-reference"),
    (
        "token-file",
        {},
        {"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"},
        "token-file",
    ),
    ("exec", {}, {"exec": {"command": "sh", "args": ["-c", "id"]}}, "exec-plugin"),
    ("auth-provider", {}, {"auth-provider": {"name": "oidc"}}, "auth-provider"),
    ("username", {}, {"username": "admin"}, "basic-auth"),
    ("password", {}, {"password": "pw"}, "basic-auth"),
    ("impersonate", {}, {"as": "system:admin"}, "impersonation"),
    ("impersonate-groups", {}, {"as-groups": ["system:masters"]}, "impersonation"),
    ("insecure", {"insecure-skip-tls-verify": True}, {}, "insecure-skip-tls-verify"),
    ("insecure-as-text", {"insecure-skip-tls-verify": "true"}, {}, "insecure-skip-tls-verify"),
    ("proxy", {"proxy-url": "http://evil:3128"}, {}, "proxy"),
    ("tls-server-name", {"tls-server-name": "kubernetes"}, {}, "tls-server-name"),
    ("http", {"server": "http://127.0.0.1:{port}"}, {}, "not-https"),
    ("userinfo", {"server": "https://a:b@127.0.0.1:{port}"}, {}, "bad-server"),
    ("no-server", {"server": None}, {}, "no-server"),
    ("bad-ca-text", {"certificate-authority-data": b64("not a certificate")}, {}, "bad-ca"),
    (
        "bad-ca-pem",
        {
            "certificate-authority-data": b64(
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
            )
        },
        {},
        "bad-ca",
    ),
    ("bad-ca-binary", {"certificate-authority-data": b64(b"\xff\xfe")}, {}, "bad-ca"),
    ("ca-not-base64", {"certificate-authority-data": "%%%"}, {}, "bad-base64"),
    (
        "cert-garbage",
        {},
        {"client-certificate-data": b64("x"), "client-key-data": b64("y")},
        "bad-client-cert",
    ),
    (
        "cert-key-mismatch",
        {},
        {
            "client-certificate-data": b64(CLIENT.cert_pem),
            "client-key-data": b64(OTHER_CLIENT.key_pem),
        },
        "bad-client-cert",
    ),
    ("cert-without-key", {}, {"client-certificate-data": b64(CLIENT.cert_pem)}, "bad-client-cert"),
    ("token-header-injection", {}, {"token": "abc\r\nX-Evil: 1"}, "bad-token"),
    ("unknown-cluster-field", {"some-future-field": 1}, {}, "unknown-field"),
    ("unknown-user-field", {}, {"some-future-field": 1}, "unknown-field"),
]


@pytest.mark.parametrize(
    ("cluster", "user", "reason"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_an_untrusted_kubeconfig_is_refused_with_its_reason_and_nothing_connects(
    listener: socket.socket, cluster: dict[str, Any], user: dict[str, Any], reason: str
) -> None:
    port = listener.getsockname()[1]
    cluster = {"server": f"https://127.0.0.1:{port}", **cluster}
    cluster = {k: v.format(port=port) if isinstance(v, str) else v for k, v in cluster.items()}
    text = yaml.safe_dump(kubeconfig(cluster, user))
    with pytest.raises(KubeconfigError) as caught:
        access_from_untrusted_kubeconfig(text)
    assert caught.value.reason == reason
    assert isinstance(caught.value, ValueError)
    assert SECRET_TOKEN not in str(caught.value)
    assert caught.value.__cause__ is None  # no library message (YAML snippet...) rides along
    assert connections(listener) == 0


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[1, 2", "not-yaml"),
        ("[" * 5000 + "]" * 5000, "not-yaml"),
        ("- a\n- b\n", "not-a-mapping"),
        ("just text", "not-a-mapping"),
        ("x: " + "a" * (1 << 20), "too-large"),
        (yaml.safe_dump(kubeconfig(**{"current-context": "nope"})), "no-context"),
        (
            yaml.safe_dump({**kubeconfig(), "current-context": None, "contexts": [{}, {}]}),
            "no-context",
        ),
        (yaml.safe_dump({**kubeconfig(), "clusters": "x"}), "no-cluster"),
        (yaml.safe_dump({**kubeconfig(), "users": [{"name": "other", "user": {}}]}), "no-user"),
        (
            yaml.safe_dump({**kubeconfig(), "clusters": [{"name": "c", "cluster": [1]}]}),
            "not-a-mapping",
        ),
    ],
)
def test_malformed_kubeconfigs_are_typed_errors(text: str, reason: str) -> None:
    with pytest.raises(KubeconfigError) as caught:
        access_from_untrusted_kubeconfig(text)
    assert caught.value.reason == reason


def test_a_yaml_error_does_not_quote_the_document() -> None:
    text = f"users:\n- user:\n    token: {SECRET_TOKEN}\n  :: [\n"
    with pytest.raises(KubeconfigError) as caught:
        access_from_untrusted_kubeconfig(text)
    assert SECRET_TOKEN not in str(caught.value)
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


def test_an_untrusted_kubeconfig_with_data_fields_is_accepted() -> None:
    doc = kubeconfig(
        user={
            "token": SECRET_TOKEN,
            "client-certificate-data": b64(CLIENT.cert_pem),
            "client-key-data": b64(CLIENT.key_pem),
        },
        cluster={"insecure-skip-tls-verify": False, "disable-compression": True},
    )
    access = access_from_untrusted_kubeconfig(yaml.safe_dump(doc))
    assert access.server == "https://127.0.0.1:6443"
    assert access.ca_pem == CA.cert_pem
    assert access.client_cert_pem == CLIENT.cert_pem
    assert access.bearer() == SECRET_TOKEN
    assert access.token_file is None
    assert access.ssl_context() is access.ssl_context()  # built once
    shown = repr(access)
    assert SECRET_TOKEN not in shown
    assert "BEGIN" not in shown
    assert "token" in shown
    assert "client-certificate" in shown


def test_without_ca_data_the_system_trust_store_verifies_and_no_ca_file_is_needed() -> None:
    doc = kubeconfig()
    del doc["clusters"][0]["cluster"]["certificate-authority-data"]
    access = access_from_untrusted_kubeconfig(yaml.safe_dump(doc))
    assert access.ca_pem is None
    assert access.ssl_context().verify_mode.name == "CERT_REQUIRED"


def test_the_only_context_is_used_without_current_context_and_unused_entries_are_ignored() -> None:
    doc = kubeconfig()
    del doc["current-context"]
    doc["users"].append({"name": "unused", "user": {"exec": {"command": "sh"}}})
    assert access_from_untrusted_kubeconfig(yaml.safe_dump(doc)).bearer() == SECRET_TOKEN


def test_own_kubeconfig_may_name_files_relative_to_itself_and_rereads_the_token(
    tmp_path: Path,
) -> None:
    (tmp_path / "ca.crt").write_bytes(CA.cert_pem)
    CLIENT.write(tmp_path / "tls.crt", tmp_path / "tls.key")
    (tmp_path / "token").write_text("first\n")
    doc = kubeconfig(
        cluster={"certificate-authority-data": None, "certificate-authority": "ca.crt"},
        user={
            "token": None,
            "tokenFile": "token",
            "client-certificate": "tls.crt",
            "client-key": "tls.key",
        },
    )
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    access = access_from_kubeconfig_file(path)
    assert access.ca_pem == CA.cert_pem
    assert access.client_key_pem == CLIENT.key_pem
    assert access.bearer() == "first"
    (tmp_path / "token").write_text("rotated\n")
    assert access.bearer() == "rotated"
    (tmp_path / "token").unlink()
    with pytest.raises(KubeUnavailable):
        access.bearer()


@pytest.mark.parametrize(
    ("user", "reason"),
    [
        ({"exec": {"command": "sh"}}, "exec-plugin"),
        ({"auth-provider": {"name": "gcp"}}, "auth-provider"),
        ({"tokenFile": "missing"}, "unreadable"),
    ],
)
def test_own_kubeconfig_still_refuses_plugins(
    tmp_path: Path, user: dict[str, Any], reason: str
) -> None:
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(kubeconfig(user=user)))
    with pytest.raises(KubeconfigError) as caught:
        access_from_kubeconfig_file(path)
    assert caught.value.reason == reason


def test_own_kubeconfig_context_can_be_chosen(tmp_path: Path) -> None:
    doc = kubeconfig()
    doc["clusters"].append({"name": "c2", "cluster": {"server": "https://other:443"}})
    doc["contexts"].append({"name": "ctx2", "context": {"cluster": "c2"}})
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    assert access_from_kubeconfig_file(path, context="ctx2").server == "https://other:443"
    assert access_from_kubeconfig_file(path, context="ctx2").bearer() is None


def test_in_cluster_access_and_load_access(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ca.crt").write_bytes(CA.cert_pem)
    (tmp_path / "token").write_text("sa-token\n")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    access = in_cluster_access(env, folder=tmp_path)
    assert access.server == "https://[fd00::1]:6443"
    assert access.bearer() == "sa-token"
    with pytest.raises(KubeconfigError) as caught:
        in_cluster_access({}, folder=tmp_path)
    assert caught.value.reason == "no-in-cluster"

    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(kubeconfig()))
    assert isinstance(load_access(f"{path}:{tmp_path / 'second'}"), ClusterAccess)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeconfigError):
        load_access(None)
