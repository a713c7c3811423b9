"""Runtime kubeconfig Secrets written by others (issue 11, items 1, 2, 3 and 7).

A Secret that breaks the rules (a local file or token file, a command, skipped TLS checks, a
plain-http server, garbage) gets a problem+json 503 `runtime-kubeconfig-invalid`, an Event on
the Kyma saying what is wrong, and no request leaves the broker: each case points its server at
a listening socket that counts connections. Only the Secret with the exact name counts.
"""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from devenv.clusters import TestCluster
from tests.integration.broker.conftest import BrokerFactory, Runtime, seed_runtime, wait_for
from tests.integration.broker.test_broker import problem_type


@pytest.fixture
def rt_a(control_plane: TestCluster, kcp_ns: str, runtime_a: TestCluster) -> Runtime:
    return seed_runtime(control_plane, kcp_ns, runtime_a)


class CountingListener:
    """A TCP socket that accepts and counts connections (and never answers)."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        port: int = self._sock.getsockname()[1]
        return port

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()


@pytest.fixture
def listener() -> Iterator[CountingListener]:
    counting = CountingListener()
    yield counting
    counting.close()


def kubeconfig(cluster: dict[str, Any], user: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )


def hostile(port: int, ca_b64: str) -> dict[str, tuple[str, str]]:
    """case → (kubeconfig text, the reason slug the broker must name)."""
    https = f"https://127.0.0.1:{port}"
    ca = {"server": https, "certificate-authority-data": ca_b64}
    token = {"token": "t"}
    exec_user = {
        "exec": {
            "command": "touch",
            "args": ["/tmp/pwned"],
            "apiVersion": "client.authentication.k8s.io/v1",
        }
    }
    not_pem = base64.b64encode(b"not a certificate").decode()
    return {
        "token-file": (
            kubeconfig(ca, {"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}),
            "token-file",
        ),
        "insecure": (
            kubeconfig({"server": https, "insecure-skip-tls-verify": True}, token),
            "insecure-skip-tls-verify",
        ),
        "plain-http": (kubeconfig({"server": f"http://127.0.0.1:{port}"}, token), "not-https"),
        "ca-file": (
            kubeconfig({"server": https, "certificate-authority": "/etc/ssl/certs/x.crt"}, token),
            "file-reference",
        ),
        "exec": (kubeconfig(ca, exec_user), "exec-plugin"),
        "not-pem-ca": (
            kubeconfig({"server": https, "certificate-authority-data": not_pem}, token),
            "bad-ca",
        ),
        "not-yaml": ("{{{{ this is not yaml", ""),
        "wrong-structure": (yaml.safe_dump(["a", "list"]), ""),
    }


def write_secret(kcp: TestCluster, namespace: str, name: str, text: str, kyma_name: str) -> None:
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(
            name=name, labels={"operator.kyma-project.io/kyma-name": kyma_name}
        ),
        data={"config": base64.b64encode(text.encode()).decode()},
    )
    try:
        kcp.core.replace_namespaced_secret(name, namespace, body)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        kcp.core.create_namespaced_secret(namespace, body)


def ca_data(cluster: TestCluster) -> str:
    doc = yaml.safe_load(cluster.kubeconfig_text)
    data: str = doc["clusters"][0]["cluster"]["certificate-authority-data"]
    return data


@pytest.mark.parametrize(
    "case",
    [
        "token-file",
        "insecure",
        "plain-http",
        "ca-file",
        "exec",
        "not-pem-ca",
        "not-yaml",
        "wrong-structure",
    ],
)
def test_a_hostile_kubeconfig_is_refused_without_a_request_and_named_in_an_event(
    case: str,
    brokers: BrokerFactory,
    rt_a: Runtime,
    listener: CountingListener,
    control_plane: TestCluster,
) -> None:
    text, reason = hostile(listener.port, ca_data(rt_a.cluster))[case]
    write_secret(
        control_plane, rt_a.namespace, f"kubeconfig-{rt_a.kyma_name}", text, rt_a.kyma_name
    )
    broker = brokers(BROKER_IDENTITY_MODE="tokenreview")
    r = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert problem_type(r) == "runtime-kubeconfig-invalid"
    assert r.headers.get("Retry-After")
    if reason:
        assert reason in r.json()["detail"]
    assert listener.accepted == 0  # nothing left the broker towards the Secret's server

    def warning_event() -> Any:
        events = control_plane.core.list_namespaced_event(rt_a.namespace).items
        return next((e for e in events if e.reason == "RuntimeKubeconfigInvalid"), None)

    event = wait_for(warning_event, what="a Warning Event on the Kyma")
    assert event.type == "Warning"
    assert event.involved_object.kind == "Kyma"
    assert event.involved_object.name == rt_a.kyma_name
    assert "eyJ" not in event.message  # says what is wrong, not what is in it
    assert all(r["status"] != 500 for r in broker.logs() if "status" in r)


def test_only_the_secret_with_the_exact_name_counts(
    brokers: BrokerFactory,
    rt_a: Runtime,
    listener: CountingListener,
    control_plane: TestCluster,
) -> None:
    # A second Secret with the Kyma's label, pointing at another server, must not stand in
    # for kubeconfig-<runtime id>, whatever the order the API server lists them in.
    for prefix in ("a-", "zz-"):
        decoy = kubeconfig(
            {
                "server": f"https://127.0.0.1:{listener.port}",
                "certificate-authority-data": ca_data(rt_a.cluster),
            },
            {"token": "stolen"},
        )
        write_secret(control_plane, rt_a.namespace, f"{prefix}decoy", decoy, rt_a.kyma_name)
    broker = brokers(BROKER_IDENTITY_MODE="tokenreview")
    r = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert r.status_code == 201, r.text
    assert listener.accepted == 0
