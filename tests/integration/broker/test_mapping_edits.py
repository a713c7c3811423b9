"""Operators edit mappings: exactly-once registration does not rest on the mapping's existence.

A force-deleted mapping (finalizer removed, then deleted) never leads to a second registration,
also after a broker restart; a plain delete of a live runtime's mapping does not unregister it
(it is recorded again); dropping a runtime from Compass takes the explicit annotation; and a
fleet whose mappings operators delete, force-delete and edit mid-run ends with one registration
per Kyma and none left once the Kymas are gone.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from devenv.clusters import TestCluster
from tests.integration.broker.conftest import GROUP, BrokerFactory, Runtime, seed_runtime, wait_for

COMPASS_ID = "kyma-project.io/compass-runtime-id"
UNREGISTER = "compass-broker.kyma-project.io/unregister"


@pytest.fixture
def rt(control_plane: TestCluster, kcp_ns: str, runtime_a: TestCluster) -> Runtime:
    return seed_runtime(control_plane, kcp_ns, runtime_a)


def registered(sim: Any, runtime: Runtime) -> list[Any]:
    return [
        r
        for r in sim.runtimes(runtime.tenant)
        if r.labels.get("kyma_runtime_id") == runtime.runtime_id
    ]


def mapped_id(runtime: Runtime) -> str | None:
    mapping = runtime.mapping()
    return None if mapping is None else (mapping["metadata"].get("labels") or {}).get(COMPASS_ID)


def patch_mapping(runtime: Runtime, body: dict[str, Any]) -> None:
    runtime.kcp.custom.patch_namespaced_custom_object(
        GROUP, "v1beta1", runtime.namespace, "compassmanagermappings", runtime.kyma_name, body
    )


def delete_mapping(runtime: Runtime, *, force: bool) -> None:
    """`force`: as an operator does when a deletion hangs: the finalizer off, then delete."""
    try:
        if force:
            patch_mapping(runtime, {"metadata": {"finalizers": None}})
        runtime.kcp.custom.delete_namespaced_custom_object(
            GROUP, "v1beta1", runtime.namespace, "compassmanagermappings", runtime.kyma_name
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


def reasons(runtime: Runtime) -> set[str]:
    events = runtime.kcp.core.list_namespaced_event(
        runtime.namespace, field_selector=f"involvedObject.name={runtime.kyma_name}"
    ).items
    return {e.reason for e in events}


def test_a_force_deleted_mapping_is_found_in_director_not_registered_again(
    brokers: BrokerFactory, rt: Runtime, sim: Any
) -> None:
    broker = brokers()
    first = broker.request_token(rt.runtime_id, rt.token())
    assert first.status_code == 201
    compass_id = first.json()["compassRuntimeID"]
    wait_for(lambda: mapped_id(rt) == compass_id, what="the ID recorded")
    delete_mapping(rt, force=True)
    wait_for(lambda: rt.mapping() is None, what="the mapping gone")
    second = broker.request_token(rt.runtime_id, rt.token())
    assert second.status_code == 201, second.text
    assert second.json()["compassRuntimeID"] == compass_id
    assert len(registered(sim, rt)) == 1
    assert wait_for(lambda: mapped_id(rt) == compass_id, what="the ID recorded again")


def test_a_mapping_force_deleted_while_no_broker_ran_is_found_too(
    brokers: BrokerFactory, rt: Runtime, sim: Any
) -> None:
    broker = brokers()
    first = broker.request_token(rt.runtime_id, rt.token())
    assert first.status_code == 201
    wait_for(lambda: mapped_id(rt), what="the ID recorded")
    assert broker.stop() == 0
    delete_mapping(rt, force=True)
    wait_for(lambda: rt.mapping() is None, what="the mapping gone")
    again = brokers()
    second = again.request_token(rt.runtime_id, rt.token())
    assert second.status_code == 201, second.text
    assert second.json()["compassRuntimeID"] == first.json()["compassRuntimeID"]
    assert len(registered(sim, rt)) == 1


def test_deleting_a_live_runtimes_mapping_does_not_unregister_it(
    brokers: BrokerFactory, rt: Runtime, sim: Any
) -> None:
    broker = brokers()
    answer = broker.request_token(rt.runtime_id, rt.token())
    assert answer.status_code == 201
    compass_id = answer.json()["compassRuntimeID"]
    wait_for(lambda: mapped_id(rt) == compass_id, what="the ID recorded")
    old_uid = rt.mapping()["metadata"]["uid"]  # type: ignore[index]
    delete_mapping(rt, force=False)  # a plain kubectl delete
    wait_for(
        lambda: (m := rt.mapping()) is not None and m["metadata"]["uid"] != old_uid,
        timeout=30,
        what="a new mapping",
    )
    assert mapped_id(rt) == compass_id
    assert [r.id for r in registered(sim, rt)] == [compass_id]  # still in Compass
    assert sim.counters().get("unregisterRuntime") is None
    assert wait_for(lambda: "MappingReplaced" in reasons(rt), what="the Event")
    assert broker.request_token(rt.runtime_id, rt.token()).status_code == 201
    assert len(registered(sim, rt)) == 1


def test_the_unregister_annotation_drops_the_runtime_from_compass(
    brokers: BrokerFactory, rt: Runtime, sim: Any
) -> None:
    broker = brokers()
    assert broker.request_token(rt.runtime_id, rt.token()).status_code == 201
    wait_for(lambda: mapped_id(rt), what="the ID recorded")
    patch_mapping(rt, {"metadata": {"annotations": {UNREGISTER: "leaves UCL"}}})
    wait_for(lambda: not registered(sim, rt), timeout=30, what="unregistered")
    wait_for(lambda: rt.mapping() is None, timeout=30, what="the mapping removed")
    assert "RuntimeUnregistered" in reasons(rt)


def test_operators_deleting_and_editing_mappings_mid_run_leave_no_duplicate_and_no_orphan(
    brokers: BrokerFactory,
    control_plane: TestCluster,
    kcp_ns: str,
    runtime_a: TestCluster,
    sim: Any,
) -> None:
    fleet = [seed_runtime(control_plane, kcp_ns, runtime_a) for _ in range(12)]
    replicas = [brokers(), brokers()]
    stop = threading.Event()
    rng = random.Random(26)
    edits: Counter[str] = Counter()

    def operator() -> None:
        while not stop.is_set():
            runtime = rng.choice(fleet)
            action = rng.choice(["delete", "force", "edit"])
            try:
                if action == "edit":
                    patch_mapping(
                        runtime, {"metadata": {"labels": {"touched": str(time.time_ns())}}}
                    )
                else:
                    delete_mapping(runtime, force=action == "force")
                edits[action] += 1
            except ApiException:
                edits["refused"] += 1
            time.sleep(0.05)

    def agent(runtime: Runtime) -> list[int]:
        """Asks a few times, then until it has a token (a loaded machine may need longer)."""
        codes: list[int] = []
        deadline = time.monotonic() + 60
        for i in range(1000):
            answer = replicas[i % 2].request_token(runtime.runtime_id, runtime.token())
            codes.append(answer.status_code)
            if (i >= 7 and 201 in codes) or time.monotonic() > deadline:
                return codes
            time.sleep(0.2)
        return codes

    chaos = threading.Thread(target=operator, daemon=True)
    chaos.start()
    try:
        with ThreadPoolExecutor(max_workers=len(fleet)) as pool:
            results = list(pool.map(agent, fleet))
    finally:
        stop.set()
        chaos.join(5)
    assert edits["delete"]
    assert edits["force"]
    assert edits["edit"]
    assert all(201 in codes for codes in results), results
    for runtime in fleet:
        assert len(registered(sim, runtime)) == 1, runtime.runtime_id  # 0 duplicates
        # Every mapping the operator took away is back, recording the runtime Director holds.
        wait_for(
            lambda r=runtime: mapped_id(r) == registered(sim, r)[0].id,
            timeout=30,
            what="the mapping re-adopted",
        )
    for runtime in fleet:
        runtime.delete_kyma()
    for runtime in fleet:
        wait_for(
            lambda r=runtime: not registered(sim, r), timeout=60, what="unregistered"
        )  # 0 orphans
