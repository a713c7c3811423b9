"""A failed request names its server and its cause (never a path, a query or user info)."""

from __future__ import annotations

import socket

import httpx
import pytest

from kubeapi import ClusterAccess, KubeClient, KubeUnavailable, describe_transport_error


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nobody listens on it any more


async def test_a_refused_connection_names_host_port_and_cause() -> None:
    port = closed_port()
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ConnectError) as caught:
            await http.get(f"http://user:pw@127.0.0.1:{port}/secret/path?token=x")
    text = describe_transport_error(caught.value)
    assert text.startswith(f"ConnectError (http://127.0.0.1:{port}): ")
    assert "refused" in text.lower() or "connection attempts failed" in text.lower()
    for leaked in ("/secret/path", "token", "pw"):
        assert leaked not in text


def test_a_cause_without_text_is_looked_for_down_the_chain_and_kept_on_one_line() -> None:
    request = httpx.Request("GET", "https://api.example:6443/api")
    try:
        try:
            raise OSError("TLS handshake\nfailed \x1b[31m here")
        except OSError as inner:
            raise httpx.ConnectTimeout("", request=request) from inner
    except httpx.ConnectTimeout as exc:
        text = describe_transport_error(exc)
    assert text == "ConnectTimeout (https://api.example:6443): TLS handshake failed [31m here"


def test_no_request_no_server_and_no_text_says_so() -> None:
    assert describe_transport_error(httpx.ReadTimeout("")) == "ReadTimeout: no detail"


async def test_the_kube_client_says_which_api_server_failed_and_why() -> None:
    port = closed_port()
    access = ClusterAccess(server=f"https://127.0.0.1:{port}")
    client = KubeClient(access, user_agent="test", timeout=2.0)
    try:
        with pytest.raises(KubeUnavailable) as caught:
            await client.get("/api/v1/namespaces/x")
    finally:
        await client.aclose()
    assert f"GET /api/v1/namespaces/x: ConnectError (https://127.0.0.1:{port}): " in str(
        caught.value
    )
