"""The real lifecycle-manager (KLM) on a runtime with a real node (devenv.node; issue 41 item 5):
the kubelet runs the agent pod from the manifest KLM applied, kube-controller-manager writes the
Deployment's status from the pod's readiness probe, and KLM reads that as the module state. No
status is written by hand: devenv.klm.RolloutStandIn refuses a runtime with a node, and each
test checks that the status's only writer is the controller-manager.

The module is published as `make module` writes it, with only what this machine needs changed
(tests/integration/klm/conftest.py: node_runtime). One node and one runtime for the module's
tests, in the state the first leaves: the agent asking for its token while Compass is down.
Where no node can run here, both skip with the reason, as tests/integration/node does.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from kubernetes import client

from devenv import klm
from devenv.node import NODE_NAME
from tests.integration.agent.conftest import token_reply
from tests.integration.klm.conftest import (
    CONFIG,
    INSTALL,
    MODULE,
    NodeRuntime,
    deployment,
    enable_module,
    module_ready,
)
from tests.integration.node.conftest import deployment_condition, token_secret
from tests.integration.waiting import eventually

# Outside make test (which builds the image first) a changed tree builds it here: minutes.
pytestmark = pytest.mark.timeout(900)

# The readiness probe of the module's Deployment asks every 10 s and gives up after 3 failures;
# the agent says not ready after 3 unanswered attempts; KLM requeues every 2 s here.
NOT_READY = 90.0
STATUS_WRITER = "kube-controller-manager"


@pytest.fixture(scope="module")
async def installed(node_runtime: NodeRuntime) -> NodeRuntime:
    """The module enabled on the runtime and Ready, with Compass down (the agent pulling)."""
    rt = node_runtime
    await enable_module(rt)
    enabled = time.monotonic()
    await module_ready(rt)
    now = time.monotonic()
    print(
        f"\nKLM on a node: module and Kyma Ready {now - enabled:.1f}s after the module was "
        f"enabled, {now - rt.added:.1f}s after the runtime's Kyma was created in the KCP"
    )
    return rt


def apps(rt: NodeRuntime) -> client.AppsV1Api:
    return client.AppsV1Api(rt.cluster.api_client)


def available(rt: NodeRuntime) -> str | None:
    return deployment_condition(apps(rt), klm.KYMA_NAMESPACE, CONFIG.manager.name)


def status_writers(found: client.V1Deployment) -> set[str]:
    """Who wrote the Deployment's status subresource (server-side managedFields)."""
    return {
        str(entry.manager)
        for entry in found.metadata.managed_fields or []
        if entry.subresource == "status"
    }


def agent_pods(rt: NodeRuntime) -> list[client.V1Pod]:
    return list(
        rt.cluster.core.list_namespaced_pod(
            klm.KYMA_NAMESPACE, label_selector="app.kubernetes.io/name=compass-agent"
        ).items
    )


def token_claims(headers: dict[str, str]) -> dict[str, Any]:
    """The claims of the bearer token the agent sent (not verified: only who it names)."""
    payload = headers["authorization"].removeprefix("Bearer ").split(".")[1]
    padded = payload + "=" * (-len(payload) % 4)
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(padded))
    return claims


async def test_klm_reads_the_status_the_controller_manager_writes_for_the_agent_pod(
    installed: NodeRuntime,
) -> None:
    rt = installed
    for name in (CONFIG.manager.name, klm.WEBHOOK_DEPLOYMENT):
        found = deployment(rt, name)
        assert found is not None, name
        status = found.status
        assert status.observed_generation == found.metadata.generation, name
        assert status.ready_replicas == 1, name
        conditions = {c.type: (c.status, c.reason) for c in status.conditions or []}
        assert conditions["Available"] == ("True", "MinimumReplicasAvailable"), name
        assert conditions["Progressing"] == ("True", "NewReplicaSetAvailable"), name
        assert status_writers(found) == {STATUS_WRITER}, name
    # The pod ran on the node from make image's image, Ready by the kubelet's probe.
    (pod,) = agent_pods(rt)
    assert pod.spec.node_name == NODE_NAME
    assert pod.status.phase == "Running"
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"
    (container,) = pod.spec.containers
    assert pod.status.container_statuses[0].image_id, "the kubelet reports no image"
    # It asked the broker with the token the kubelet projected into it (audience compass-broker),
    # for the runtime ID KLM labelled the runtime's Kyma with.
    await eventually(lambda: rt.broker.requests, what="the agent asking for its token", within=60)
    _, path, headers = rt.broker.requests[-1]
    assert path == f"/v1/runtimes/{rt.runtime_id}/token"
    claims = token_claims(headers)
    assert claims["aud"] == ["compass-broker"]
    assert claims["kubernetes.io"]["pod"]["name"] == pod.metadata.name
    assert claims["kubernetes.io"]["node"]["name"] == NODE_NAME
    assert container.image_pull_policy == "Never"
    # And no stand-in can be put on this runtime by mistake.
    with pytest.raises(RuntimeError, match="has a node"):
        klm.RolloutStandIn(rt.cluster).start()


async def test_a_failing_readyz_turns_the_deployment_unavailable_and_shows_in_the_module_state(
    installed: NodeRuntime,
) -> None:
    rt = installed
    await module_ready(rt)
    # The broker gone (a NetworkPolicy, DNS): the agent's /readyz fails, the kubelet's probe
    # marks the pod not ready, the controller-manager turns the Deployment Available=False.
    await rt.broker.stop()
    stopped = time.monotonic()
    await eventually(
        lambda: available(rt) == "False",
        what="the agent Deployment Available=False",
        within=NOT_READY,
        interval=0.5,
    )
    unavailable = time.monotonic()
    await eventually(
        lambda: rt.module_state() not in ("Ready", None),
        what="the module no longer Ready",
        within=INSTALL,
        interval=0.5,
    )
    shown = time.monotonic()
    module = klm.module_status(rt.kcp_kyma(), MODULE) or {}
    print(
        f"\nbroker stopped -> Deployment Available=False {unavailable - stopped:.1f}s -> module "
        f"{module.get('state')} {shown - stopped:.1f}s (Kyma {rt.kyma_state()})"
    )
    found = deployment(rt, CONFIG.manager.name)
    assert found is not None
    assert status_writers(found) == {STATUS_WRITER}
    conditions = {c.type: (c.status, c.reason) for c in found.status.conditions or []}
    assert conditions["Available"] == ("False", "MinimumReplicasUnavailable")
    assert conditions["Progressing"] == ("True", "NewReplicaSetAvailable")
    # KLM's deployment state check: progressing done but not available is Processing.
    assert module.get("state") == "Processing"
    await eventually(
        lambda: rt.kyma_state() == "Processing", what="the Kyma Processing", within=INSTALL
    )

    # The broker back with a token: the agent writes it, the probe passes again, Ready again.
    rt.broker.script = token_reply
    await rt.broker.start()
    back = time.monotonic()
    await eventually(
        lambda: token_secret(rt.cluster), what="compass-agent-configuration", within=60
    )
    await module_ready(rt)
    print(f"broker back -> module and Kyma Ready {time.monotonic() - back:.1f}s")
    found = deployment(rt, CONFIG.manager.name)
    assert found is not None
    assert status_writers(found) == {STATUS_WRITER}
