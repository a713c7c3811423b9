"""Revocation against real API servers, the Compass simulator and real broker processes: one
`kubectl annotate` on the mapping refuses the runtime's tokens and reports (403
`runtime-revoked`, a Warning Event on the Kyma), unproven callers still get 401, the Compass
registration stays, removing the annotation restores service; in xfcc mode the deny list file
does the same, re-read while the broker runs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from devenv.clusters import TestCluster
from tests.integration.broker.conftest import GROUP, BrokerFactory, Runtime, seed_runtime, wait_for
from tests.integration.broker.test_connection_reports import mapping_table, row_of

PROBLEM = "urn:kyma-compass-pull:broker:problem:"
REVOKED = "compass-broker.kyma-project.io/revoked"
H_A, H_OTHER = "a1" * 32, "b2" * 32


def problem_type(response: httpx.Response) -> str:
    assert response.headers["content-type"].startswith("application/problem+json")
    return str(response.json()["type"]).removeprefix(PROBLEM)


def report_body() -> dict[str, Any]:
    return {
        "connectionState": "Connected",
        "observedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def annotate(rt: Runtime, value: str | None) -> None:
    """`kubectl annotate compassmanagermapping <kyma> <REVOKED>=<value>` (None: `<REVOKED>-`)."""
    rt.kcp.custom.patch_namespaced_custom_object(
        GROUP,
        "v1beta1",
        rt.namespace,
        "compassmanagermappings",
        rt.kyma_name,
        {"metadata": {"annotations": {REVOKED: value}}},
    )


def events(rt: Runtime, reason: str) -> list[Any]:
    return [
        e
        for e in rt.kcp.core.list_namespaced_event(rt.namespace).items
        if e.reason == reason and e.involved_object.name == rt.kyma_name
    ]


def attempts(sim: Any, operation: str) -> int:
    counter = sim.counters().get(operation)
    return 0 if counter is None else int(counter.attempts)


@pytest.fixture
def rt_a(control_plane: TestCluster, kcp_ns: str, runtime_a: TestCluster) -> Runtime:
    return seed_runtime(control_plane, kcp_ns, runtime_a)


def test_a_revoked_runtime_is_refused_told_and_restored_without_unregistering(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    broker = brokers(BROKER_RATE_LIMIT_BURST="100", BROKER_REPORT_MIN_INTERVAL_SECONDS="0.05")
    first = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert first.status_code == 201, first.text
    [registered] = list(sim.runtimes(rt_a.tenant))
    r = broker.report_connection(rt_a.runtime_id, rt_a.token(), body=report_body())
    assert r.status_code == 202, r.text

    def row() -> dict[str, Any]:
        return row_of(mapping_table(rt_a.kcp, rt_a.namespace), rt_a.kyma_name)

    assert (row()["Connected"], row()["Revoked"]) == ("True", None)

    annotate(rt_a, "decommissioned, ticket OPS-42")
    # `kubectl get cmm`: not connected while revoked, and why, without waiting for a check.
    wait_for(lambda: row()["Connected"] == "False", what="Connected False while revoked")
    assert row()["Revoked"] == "decommissioned, ticket OPS-42"
    [connected] = [
        c for c in (rt_a.mapping() or {})["status"]["conditions"] if c["type"] == "Connected"
    ]
    assert connected["reason"] == "Revoked"
    assert connected["message"] == "an operator revoked this runtime: decommissioned, ticket OPS-42"
    refused = wait_for(
        lambda: (r := broker.request_token(rt_a.runtime_id, rt_a.token())).status_code == 403 and r,
        what="the revocation reaching the broker's view",
    )
    assert problem_type(refused) == "runtime-revoked"
    assert refused.json()["title"] == "The runtime is revoked in the control plane"
    assert "decommissioned, ticket OPS-42" in refused.json()["detail"]
    tokens = attempts(sim, "requestOneTimeTokenForRuntime")

    recorded = (rt_a.mapping() or {})["status"]["connection"]
    r = broker.report_connection(rt_a.runtime_id, rt_a.token(), body=report_body())
    assert (r.status_code, problem_type(r)) == (403, "runtime-revoked")
    assert (rt_a.mapping() or {})["status"]["connection"] == recorded  # nothing recorded
    # Who cannot prove to be the runtime learns nothing: 401, as for any runtime.
    for answer in (
        broker.request_token(rt_a.runtime_id, "garbage"),
        broker.report_connection(rt_a.runtime_id, "garbage", body=report_body()),
        broker.request_token(rt_a.runtime_id),
    ):
        assert (answer.status_code, problem_type(answer)) == (401, "identity-not-proven")

    wait_for(lambda: events(rt_a, "RuntimeRevoked"), what="the RuntimeRevoked Event")
    [event] = events(rt_a, "RuntimeRevoked")
    assert event.type == "Warning"
    assert event.involved_object.kind == "Kyma"
    assert "decommissioned, ticket OPS-42" in event.message
    metrics = broker.metrics()
    assert 'broker_revoked_refusals_total{endpoint="token",source="annotation"}' in metrics
    assert 'broker_revoked_refusals_total{endpoint="connection",source="annotation"} 1.0' in metrics
    assert 'broker_runtimes_attention{reason="revoked"} 1.0' in metrics

    # Revocation never unregisters: a Kyma label change is still synced to the same runtime
    # (proof the leader went over the revoked mapping), and nothing was unregistered.
    rt_a.patch_kyma({"metadata": {"labels": {"kyma-project.io/broker-plan-name": "marker"}}})
    wait_for(
        lambda: next(iter(sim.runtimes(rt_a.tenant))).labels.get("broker_plan_name") == "marker",
        what="the marker label in Director",
    )
    assert [rt.id for rt in sim.runtimes(rt_a.tenant)] == [registered.id]
    assert attempts(sim, "unregisterRuntime") == 0
    assert attempts(sim, "requestOneTimeTokenForRuntime") == tokens  # none while revoked

    annotate(rt_a, None)
    wait_for(
        lambda: broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201,
        what="tokens again after un-revoking",
    )
    # The last report speaks again.
    wait_for(lambda: row()["Connected"] == "True", what="Connected True after un-revoking")
    r = broker.report_connection(rt_a.runtime_id, rt_a.token(), body=report_body())
    assert r.status_code == 202, r.text


def test_an_empty_reason_revokes_too(brokers: BrokerFactory, rt_a: Runtime) -> None:
    broker = brokers(BROKER_RATE_LIMIT_BURST="100")
    assert broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201
    annotate(rt_a, "")
    refused = wait_for(
        lambda: (r := broker.request_token(rt_a.runtime_id, rt_a.token())).status_code == 403 and r,
        what="the revocation reaching the broker's view",
    )
    assert problem_type(refused) == "runtime-revoked"
    assert refused.json()["detail"] == "an operator revoked this runtime"


def xfcc(rt: Runtime, certificate_hash: str | None) -> dict[str, str]:
    pairs = [f"Hash={certificate_hash}"] if certificate_hash else []
    pairs.append(f'Subject="O=kyma,CN={rt.runtime_id}"')
    return {"x-forwarded-client-cert": ";".join(pairs)}


def test_the_xfcc_deny_list_refuses_listed_certificates_and_follows_the_file(
    brokers: BrokerFactory, rt_a: Runtime, tmp_path: Path
) -> None:
    deny = tmp_path / "deny-list"
    deny.write_text(f"# revoked client certificates\n{H_OTHER}\n")
    broker = brokers(
        BROKER_IDENTITY_MODE="xfcc",
        BROKER_XFCC_TRUSTED="true",
        BROKER_XFCC_DENY_LIST_FILE=str(deny),
        BROKER_RATE_LIMIT_BURST="100",
    )
    assert broker.request_token(rt_a.runtime_id, headers=xfcc(rt_a, H_A)).status_code == 201
    r = broker.request_token(rt_a.runtime_id, headers=xfcc(rt_a, H_OTHER))
    assert (r.status_code, problem_type(r)) == (403, "runtime-revoked")
    assert r.json()["detail"] == "this runtime's client certificate is on the deny list"
    # Without a hash the deny list cannot be checked: no identity.
    r = broker.request_token(rt_a.runtime_id, headers=xfcc(rt_a, None))
    assert (r.status_code, problem_type(r)) == (401, "identity-not-proven")

    # The operator adds A's certificate (upper case, with a comment, next to a typo).
    deny.write_text(f"{H_OTHER}\nnot-a-hash\n{H_A.upper()}  # rt-a, ticket OPS-43\n")
    refused = wait_for(
        lambda: (
            (r := broker.request_token(rt_a.runtime_id, headers=xfcc(rt_a, H_A))).status_code == 403
            and r
        ),
        what="the changed deny list read",
    )
    assert problem_type(refused) == "runtime-revoked"
    r = broker.report_connection(rt_a.runtime_id, headers=xfcc(rt_a, H_A), body=report_body())
    assert (r.status_code, problem_type(r)) == (403, "runtime-revoked")
    ignored = [e for e in broker.logs() if e.get("msg", "").startswith("deny list lines ignored")]
    assert ignored
    assert ignored[-1]["lines"] == [2]
    wait_for(lambda: events(rt_a, "RuntimeRevoked"), what="the RuntimeRevoked Event")
    assert 'source="deny-list"' in broker.metrics()

    deny.write_text(f"{H_OTHER}\n")
    wait_for(
        lambda: broker.request_token(rt_a.runtime_id, headers=xfcc(rt_a, H_A)).status_code == 201,
        what="A's certificate taken off the deny list",
    )


def test_a_revocation_outlives_unregistering_by_switching_the_module_off_and_on(
    brokers: BrokerFactory, rt_a: Runtime, sim: Any
) -> None:
    """Whoever can switch the module off can have the runtime unregistered
    (`BROKER_MODULE_DISABLED_POLICY=unregister`); switching it on again must not lift the
    revocation: the mapping stays, holding only the revocation, until the Kyma goes."""
    broker = brokers(BROKER_MODULE_DISABLED_POLICY="unregister", BROKER_RATE_LIMIT_BURST="100")
    assert broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201
    annotate(rt_a, "leaked credentials")
    wait_for(
        lambda: broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 403,
        what="the revocation reaching the broker's view",
    )

    rt_a.patch_kyma({"spec": {"modules": []}})
    wait_for(lambda: not list(sim.runtimes(rt_a.tenant)), what="the unregistration")

    def runtime_dropped() -> bool:
        mapping = rt_a.mapping()
        labels = (mapping or {}).get("metadata", {}).get("labels") or {}
        return "kyma-project.io/compass-runtime-id" not in labels

    wait_for(runtime_dropped, what="the mapping to drop the unregistered runtime")
    kept = rt_a.mapping()
    assert kept is not None, "the revoked runtime's mapping was deleted with its registration"
    assert kept["metadata"]["annotations"][REVOKED] == "leaked credentials"

    rt_a.patch_kyma({"spec": {"modules": [{"name": "application-connector"}]}})
    # A broker started now sees the module on from its first answer (revocation is judged
    # before the module, so the first broker's 403 could not tell).
    broker = brokers(BROKER_MODULE_DISABLED_POLICY="unregister", BROKER_RATE_LIMIT_BURST="100")
    refused = broker.request_token(rt_a.runtime_id, rt_a.token())
    assert (refused.status_code, problem_type(refused)) == (403, "runtime-revoked")
    assert attempts(sim, "registerRuntime") == 1
    assert attempts(sim, "unregisterRuntime") == 1

    # Lifted, the runtime is registered again on its next request.
    annotate(rt_a, None)
    wait_for(
        lambda: broker.request_token(rt_a.runtime_id, rt_a.token()).status_code == 201,
        what="tokens again after lifting the revocation",
    )
    assert len(list(sim.runtimes(rt_a.tenant))) == 1
    assert attempts(sim, "registerRuntime") == 2
