"""The broker, started as the README says, against the real Compass Director.

Director's own database is the judge: every test counts the runtimes Director holds for its Kyma
(by our label `kyma_runtime_id`), and the calls the gateway passed to Director, as differences
(the stack is shared by the test run). Each test has tenants and runtime IDs of its own.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509

from devenv.clusters import TestCluster
from devenv.real_director import RealCompass, RealConnector
from devenv.runtime_agent_sim import CONFIGURATION_QUERY, exchange_token
from tests.integration.broker.conftest import (
    CRASH_AFTER_REGISTER,
    GROUP,
    MAPPING_CRD,
    Broker,
    BrokerFactory,
    Runtime,
    seed_runtime,
    wait_for,
)

RUNTIME_ID_LABEL = "kyma_runtime_id"
SUBACCOUNT = "kyma-project.io/subaccount-id"
GLOBAL_ACCOUNT = "kyma-project.io/global-account-id"
PROBLEM = "urn:kyma-compass-pull:broker:problem:"


@dataclass
class Target:
    director_url: str


@pytest.fixture
def kcp_ns(control_plane: TestCluster, namespace_factory: Any) -> str:
    control_plane.apply_crds(sorted(MAPPING_CRD.glob("*.yaml")))
    ns: str = namespace_factory(control_plane)
    return ns


@pytest.fixture
def real_brokers(
    control_plane: TestCluster,
    kcp_ns: str,
    real_compass: RealCompass,
    tmp_path: Path,
) -> Iterator[BrokerFactory]:
    creds = real_compass.write_credentials_file(tmp_path / "credentials.yaml")
    factory = BrokerFactory(control_plane, kcp_ns, Target(real_compass.director_url), creds)
    try:
        yield factory
    finally:
        for broker in factory.started:
            broker.stop()
            broker.kill()


def seed(
    real_compass: RealCompass,
    kcp: TestCluster,
    ns: str,
    cluster: TestCluster,
    *,
    known_subaccount: bool = True,
    known_account: bool = True,
    shoot: str | None = None,
) -> Runtime:
    """A Kyma in KCP whose global account (and subaccount) Director knows, as the tenant
    fetcher would have synced them."""
    runtime = seed_runtime(kcp, ns, cluster, shoot=shoot)
    kyma = runtime.kyma()
    assert kyma is not None
    if known_account:
        real_compass.add_global_account(runtime.tenant)
        if known_subaccount:
            real_compass.add_subaccount(
                kyma["metadata"]["labels"][SUBACCOUNT], parent=runtime.tenant, region="eu-1"
            )
    return runtime


def registrations(real_compass: RealCompass, runtime: Runtime) -> list[dict[str, Any]]:
    return real_compass.runtimes(label_key=RUNTIME_ID_LABEL, label_value=runtime.runtime_id)


def calls_since(real_compass: RealCompass, before: dict[str, int]) -> Counter[str]:
    now = Counter(real_compass.calls())
    now.subtract(before)
    return Counter({k: v for k, v in now.items() if v})


def assert_no_label_write_backs(real_compass: RealCompass, before: dict[str, int]) -> None:
    """A few of the reconciler's sweeps (2 s each) wrote no Director label."""
    time.sleep(3)
    assert calls_since(real_compass, before)["setRuntimeLabel"] == 0


def mapped_id(runtime: Runtime) -> str | None:
    mapping = runtime.mapping()
    if mapping is None:
        return None
    labels = mapping["metadata"].get("labels") or {}
    value: str | None = labels.get("kyma-project.io/compass-runtime-id")
    return value


def events(runtime: Runtime, reason: str) -> list[Any]:
    found = runtime.kcp.core.list_namespaced_event(
        runtime.namespace, field_selector=f"involvedObject.name={runtime.kyma_name}"
    ).items
    return [e for e in found if e.reason == reason]


def token(broker: Broker, runtime: Runtime) -> httpx.Response:
    return broker.request_token(runtime.runtime_id, runtime.token())


def test_cold_start_of_20_runtimes_registers_each_exactly_once(
    real_brokers: BrokerFactory,
    real_compass: RealCompass,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
) -> None:
    fleet = [seed(real_compass, control_plane, kcp_ns, runtime_a) for _ in range(20)]
    broker = real_brokers(BROKER_IDENTITY_MODE="jwks")
    before = real_compass.calls()
    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(lambda r: token(broker, r), fleet))
    assert [a.status_code for a in answers] == [201] * 20, [a.text for a in answers]
    for runtime, answer in zip(fleet, answers, strict=True):
        held = registrations(real_compass, runtime)
        assert len(held) == 1  # Director's database: one runtime per Kyma
        assert answer.json()["compassRuntimeID"] == held[0]["id"]
        assert held[0]["labels"]["runtimeType"] == "kyma"  # Director's own, left alone
        assert wait_for(lambda r=runtime: mapped_id(r), what="the ID recorded") == held[0]["id"]
    spent = calls_since(real_compass, before)
    assert spent["registerRuntime"] == 20
    assert spent["requestOneTimeTokenForRuntime"] == 20
    # Director adds labels of its own (runtimeType, region): the reconciler does not fight them.
    assert_no_label_write_backs(real_compass, before)


def test_label_change_is_synced_and_deleting_the_kyma_unregisters(
    real_brokers: BrokerFactory,
    real_compass: RealCompass,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
) -> None:
    runtime = seed(real_compass, control_plane, kcp_ns, runtime_a)
    broker = real_brokers(BROKER_IDENTITY_MODE="jwks")
    assert token(broker, runtime).status_code == 201
    runtime.patch_kyma({"metadata": {"labels": {"kyma-project.io/broker-plan-name": "aws"}}})
    wait_for(
        lambda: registrations(real_compass, runtime)[0]["labels"].get("broker_plan_name") == "aws",
        timeout=30,
        what="the label in Director",
    )
    runtime.delete_kyma()
    wait_for(lambda: not registrations(real_compass, runtime), timeout=30, what="unregistered")
    wait_for(lambda: runtime.mapping() is None, timeout=30, what="the mapping removed")


def test_compass_managers_registration_is_adopted_through_the_real_pagination(
    real_brokers: BrokerFactory,
    real_compass: RealCompass,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
) -> None:
    """230 runtimes carry the shoot's gardenerClusterName (three pages of Director's answer,
    its last `endCursor` empty): the broker finds them all and adopts the smallest ID."""
    shoot = f"c-{uuid.uuid4().hex[:7]}"
    runtime = seed(real_compass, control_plane, kcp_ns, runtime_a, shoot=shoot)
    # compass-manager's mapping: created before it registered, never recorded.
    control_plane.custom.create_namespaced_custom_object(
        GROUP,
        "v1beta1",
        kcp_ns,
        "compassmanagermappings",
        {
            "apiVersion": f"{GROUP}/v1beta1",
            "kind": "CompassManagerMapping",
            "metadata": {
                "name": runtime.kyma_name,
                "labels": {
                    "operator.kyma-project.io/kyma-name": runtime.kyma_name,
                    GLOBAL_ACCOUNT: runtime.tenant,
                },
            },
        },
    )
    bearer = real_compass.access_token()
    created = []
    with httpx.Client(timeout=30) as http:
        for i in range(230):
            answer = http.post(
                real_compass.director_url,
                headers={"Authorization": f"Bearer {bearer}", "Tenant": runtime.tenant},
                json={
                    "query": "mutation($in: RuntimeRegisterInput!) "
                    "{ registerRuntime(in: $in) { id } }",
                    "variables": {
                        "in": {"name": f"{shoot}-{i:03d}", "labels": {"gardenerClusterName": shoot}}
                    },
                },
            ).json()
            created.append(answer["data"]["registerRuntime"]["id"])
    broker = real_brokers(BROKER_IDENTITY_MODE="jwks")
    before = real_compass.calls()
    answer = token(broker, runtime)
    assert answer.status_code == 201, answer.text
    assert answer.json()["compassRuntimeID"] == min(created)
    spent = calls_since(real_compass, before)
    assert spent["registerRuntime"] == 0
    assert spent["runtimes"] == 1 + 3  # our label (nothing), then three pages of the shoot's


def test_answers_lost_after_director_acted_register_once(
    real_brokers: BrokerFactory,
    real_compass: RealCompass,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
) -> None:
    runtime = seed(real_compass, control_plane, kcp_ns, runtime_a)
    broker = real_brokers(BROKER_IDENTITY_MODE="jwks")
    real_compass.lose_answers("registerRuntime", count=1)
    try:
        first = token(broker, runtime)
        assert first.status_code == 503, first.text
        assert len(registrations(real_compass, runtime)) == 1  # Director did act
        before = real_compass.calls()
        second = token(broker, runtime)
        assert second.status_code == 201, second.text
    finally:
        real_compass.clear_faults()
    assert len(registrations(real_compass, runtime)) == 1
    spent = calls_since(real_compass, before)
    assert spent["registerRuntime"] == 0
    # Lost answers stay cheap: the runtime found carries every label already.
    assert_no_label_write_backs(real_compass, before)


def test_broker_killed_between_register_and_record_registers_once(
    real_brokers: BrokerFactory,
    real_compass: RealCompass,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
) -> None:
    runtime = seed(real_compass, control_plane, kcp_ns, runtime_a)
    crashing = real_brokers(
        BROKER_IDENTITY_MODE="jwks",
        BROKER_REGISTRATION_CLAIM_SECONDS="20",
        **{CRASH_AFTER_REGISTER: "1"},
    )
    with pytest.raises(httpx.HTTPError):
        token(crashing, runtime)
    assert crashing.wait_exit() != 0
    assert len(registrations(real_compass, runtime)) == 1
    broker = real_brokers(BROKER_IDENTITY_MODE="jwks", BROKER_REGISTRATION_CLAIM_SECONDS="20")
    answer = wait_for(
        lambda: (a := token(broker, runtime)).status_code == 201 and a,
        timeout=40,
        interval=1,
        what="a token once the crashed claim expired",
    )
    held = registrations(real_compass, runtime)
    assert len(held) == 1
    assert answer.json()["compassRuntimeID"] == held[0]["id"]


def unregister_behind_the_brokers_back(real_compass: RealCompass, runtime: Runtime) -> str:
    (held,) = registrations(real_compass, runtime)
    answer = httpx.post(
        real_compass.director_url,
        headers={
            "Authorization": f"Bearer {real_compass.access_token()}",
            "Tenant": runtime.tenant,
        },
        json={
            "query": "mutation($id: ID!) { unregisterRuntime(id: $id) { id } }",
            "variables": {"id": held["id"]},
        },
        timeout=30,
    )
    assert answer.json()["data"]["unregisterRuntime"]["id"] == held["id"]
    assert not registrations(real_compass, runtime)
    dead: str = held["id"]
    return dead


def test_a_runtime_unregistered_behind_the_brokers_back_is_registered_again_once(
    real_brokers: BrokerFactory,
    real_compass: RealCompass,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
) -> None:
    runtime = seed(real_compass, control_plane, kcp_ns, runtime_a)
    one = real_brokers(BROKER_IDENTITY_MODE="jwks")
    two = real_brokers(BROKER_IDENTITY_MODE="jwks")
    assert token(one, runtime).status_code == 201
    wait_for(lambda: mapped_id(runtime), what="the ID recorded")
    dead = unregister_behind_the_brokers_back(real_compass, runtime)
    time.sleep(1)  # both replicas' mapping views show the dead ID
    before = real_compass.calls()
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda b: token(b, runtime), [one, two, one, two]))
    assert {a.status_code for a in answers} <= {201, 503}, [a.text for a in answers]
    assert any(a.status_code == 201 for a in answers)
    held = registrations(real_compass, runtime)
    assert len(held) == 1  # registered again, exactly once, with two replicas
    assert held[0]["id"] != dead
    assert wait_for(lambda: mapped_id(runtime) == held[0]["id"], what="the new ID recorded")
    assert calls_since(real_compass, before)["registerRuntime"] == 1
    assert wait_for(lambda: events(runtime, "CompassRuntimeLost"), what="the Event")
    # No loop: the next request costs one token call.
    before = real_compass.calls()
    assert token(one, runtime).status_code == 201
    assert calls_since(real_compass, before) == Counter({"requestOneTimeTokenForRuntime": 1})


def test_one_runtimes_failing_label_sync_never_shuts_compass_out_for_the_others(
    real_brokers: BrokerFactory,
    real_compass: RealCompass,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
) -> None:
    broken = seed(real_compass, control_plane, kcp_ns, runtime_a)
    healthy = seed(real_compass, control_plane, kcp_ns, runtime_a)
    broker = real_brokers(BROKER_IDENTITY_MODE="jwks", BROKER_BREAKER_FAILURE_THRESHOLD="2")
    assert token(broker, broken).status_code == 201
    wait_for(lambda: mapped_id(broken), what="the ID recorded")
    dead = unregister_behind_the_brokers_back(real_compass, broken)
    # A label change makes the reconciler write a label on the missing runtime: code 10.
    broken.patch_kyma({"metadata": {"labels": {"kyma-project.io/broker-plan-name": "aws"}}})
    wait_for(lambda: mapped_id(broken) is None, timeout=30, what="the lost runtime forgotten")
    assert events(broken, "CompassRuntimeLost")
    for _ in range(3):
        assert token(broker, healthy).status_code == 201
    assert broker.gauge("broker_circuit_breaker_open") == 0
    # The forgotten runtime is registered again on its next request, with its new label.
    answer = token(broker, broken)
    assert answer.status_code == 201, answer.text
    (held,) = registrations(real_compass, broken)
    assert held["id"] != dead
    assert held["labels"]["broker_plan_name"] == "aws"


def test_an_unknown_subaccount_is_a_409_naming_the_label_and_costs_no_director_call(
    real_brokers: BrokerFactory,
    real_compass: RealCompass,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
) -> None:
    runtime = seed(real_compass, control_plane, kcp_ns, runtime_a, known_subaccount=False)
    subaccount = runtime.kyma()["metadata"]["labels"][SUBACCOUNT]  # type: ignore[index]
    broker = real_brokers(BROKER_IDENTITY_MODE="jwks", BROKER_TENANT_RECHECK_SECONDS="4")
    first = token(broker, runtime)
    assert first.status_code == 409, first.text
    problem = first.json()
    assert problem["type"] == PROBLEM + "compass-tenant-unknown"
    assert SUBACCOUNT in problem["detail"]
    assert subaccount in problem["detail"]
    mapping = wait_for(
        lambda: (m := runtime.mapping()) and (m.get("status") or {}).get("compassRefusal") and m,
        what="the refusal on the mapping",
    )
    (condition,) = [c for c in mapping["status"]["conditions"] if c["type"] == "Registered"]
    assert (condition["status"], condition["reason"]) == ("False", "CompassTenantUnknown")
    assert wait_for(lambda: events(runtime, "CompassTenantUnknown"), what="the Event")
    before = real_compass.calls()
    for _ in range(5):
        assert token(broker, runtime).status_code == 409
    assert calls_since(real_compass, before) == Counter()  # no Director call
    # The tenant fetcher syncs the subaccount; after the recheck period the runtime connects.
    real_compass.add_subaccount(subaccount, parent=runtime.tenant)
    time.sleep(4)
    answer = token(broker, runtime)
    assert answer.status_code == 201, answer.text
    assert len(registrations(real_compass, runtime)) == 1
    refusal = wait_for(
        lambda: "compassRefusal" not in ((runtime.mapping() or {}).get("status") or {}),
        what="the refusal cleared",
    )
    assert refusal


def test_an_unknown_global_account_is_a_409_naming_the_label(
    real_brokers: BrokerFactory,
    real_compass: RealCompass,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
) -> None:
    runtime = seed(real_compass, control_plane, kcp_ns, runtime_a, known_account=False)
    broker = real_brokers(BROKER_IDENTITY_MODE="jwks")
    answer = token(broker, runtime)
    assert answer.status_code == 409, answer.text
    assert GLOBAL_ACCOUNT in answer.json()["detail"]
    assert runtime.tenant in answer.json()["detail"]
    before = real_compass.calls()
    assert token(broker, runtime).status_code == 409
    assert calls_since(real_compass, before) == Counter()
    # Changing the Kyma's global account lifts the refusal at once.
    new_account = f"ga-{uuid.uuid4().hex[:8]}"
    real_compass.add_global_account(new_account)
    subaccount = runtime.kyma()["metadata"]["labels"][SUBACCOUNT]  # type: ignore[index]
    real_compass.add_subaccount(subaccount, parent=new_account)
    runtime.patch_kyma({"metadata": {"labels": {GLOBAL_ACCOUNT: new_account}}})
    answer = wait_for(
        lambda: (a := token(broker, runtime)).status_code == 201 and a,
        timeout=10,
        what="the refusal lifted",
    )
    assert len(registrations(real_compass, runtime)) == 1


def test_the_brokers_token_becomes_a_client_certificate_at_the_real_connector(
    real_brokers: BrokerFactory,
    real_compass: RealCompass,
    real_connector: RealConnector,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
) -> None:
    """What the broker hands out is what Compass's own Connector takes: token ->
    `configuration` -> CSR -> `signCertificateSigningRequest` -> a certificate named after the
    token's SystemAuth, signed by the Connector's CA. Spent once; spent, garbage or missing
    tokens get the real chain's HTTP 400 with an empty body."""
    runtime = seed(real_compass, control_plane, kcp_ns, runtime_a)
    broker = real_brokers(BROKER_IDENTITY_MODE="jwks")
    answer = token(broker, runtime)
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert body["connectorURL"] == real_connector.url  # Director's connectorURL, verbatim
    compass_id = body["compassRuntimeID"]
    ((auth_id,),) = real_compass.query(
        "SELECT id FROM system_auths WHERE runtime_id::text = :'id'", id=compass_id
    )
    with httpx.Client(timeout=30) as http:
        issued = exchange_token(http, body["connectorURL"], body["token"], key_size=2048)
        certificate = x509.load_pem_x509_certificate(issued.client_pem)
        assert certificate.subject.rfc4514_string() == (
            f"CN={auth_id},OU=OrgUnit,O=Org,L=Locality,ST=State,C=PL"
        )
        ca = x509.load_pem_x509_certificate(real_connector.ca_pem)
        certificate.verify_directly_issued_by(ca)
        assert (certificate.not_valid_after_utc - certificate.not_valid_before_utc).days == 90
        assert issued.director_url == real_connector.certificate_secured_director_url
        assert issued.secured_connector_url == real_connector.certificate_secured_connector_url
        # Two tokens spent at Director by the hydrator: the broker's and the CSR token.
        assert real_compass.connector_exchanges(compass_id) == 2

        configuration = {"query": CONFIGURATION_QUERY}
        for headers in ({"Connector-Token": body["token"]}, {"Connector-Token": "garbage"}, {}):
            refused = http.post(body["connectorURL"], json=configuration, headers=headers)
            assert (refused.status_code, refused.content) == (400, b""), headers
    assert real_compass.connector_exchanges(compass_id) == 2
