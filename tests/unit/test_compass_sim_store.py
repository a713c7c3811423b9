"""The simulator's store: the label index answers exactly what a full scan would,
through updates and deletes, and tokens go with their runtime."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from devenv.compass_sim.labels import matches, parse_filters
from devenv.compass_sim.store import ConnectorTokenRecord, Store, TokenKind

NOW = datetime(2024, 7, 4, tzinfo=UTC)
VALUES: list[Any] = ["a", "b", 1, 1.0, 2, True, None, ["a", "b"], [1, "x"], {"a": 1}, [{"a": 1}]]
QUERIES = ['"a"', '"b"', "1", "1.0", "true", "null", '["a"]', '{"a": 1}', '"x"', "2"]


def _random_labels(rng: random.Random) -> dict[str, Any]:
    return {key: rng.choice(VALUES) for key in rng.sample(["k1", "k2", "k3"], rng.randint(0, 3))}


def test_indexed_filtering_equals_a_full_scan() -> None:
    rng = random.Random(7)
    store = Store()
    for i in range(60):
        store.create_runtime(rng.choice(["t1", "t2"]), now=NOW, name=f"rt-{i}", labels={})
    for step in range(300):
        victim = rng.choice(store.runtimes())
        if step % 25 == 0:
            store.delete_runtime(victim.tenant, victim.id)
            store.create_runtime(victim.tenant, now=NOW, name="again", labels=_random_labels(rng))
        else:
            store.replace_runtime(victim.model_copy(update={"labels": _random_labels(rng)}))
    for key in ["k1", "k2", "k3"]:
        for query in QUERIES:
            for extra in ([], [{"key": "k2"}], [{"key": "k3", "query": '"b"'}]):
                raw = [{"key": key, "query": query}, *extra]
                filters = parse_filters(raw)
                for tenant in ("t1", "t2"):
                    page, total = store.list_runtimes(tenant, filters, offset=0, limit=1000)
                    expected = sorted(
                        (r for r in store.runtimes(tenant) if matches(filters, r.labels)),
                        key=lambda r: (r.name, r.id),
                    )
                    assert [r.id for r in page] == [r.id for r in expected], raw
                    assert total == len(expected)


def test_tokens_are_deleted_with_their_runtime() -> None:
    store = Store()
    keep = store.create_runtime("t", now=NOW, name="keep", labels={})
    drop = store.create_runtime("t", now=NOW, name="drop", labels={})
    for runtime_id, token_hash in [(keep.id, "h1"), (drop.id, "h2"), (drop.id, "h3")]:
        store.add_token(
            ConnectorTokenRecord(
                token_hash=token_hash,
                kind=TokenKind.ONE_TIME,
                runtime_id=runtime_id,
                tenant="t",
                created_at=NOW,
                expires_at=NOW + timedelta(hours=1),
            )
        )
    store.delete_runtime("t", drop.id)
    assert [t.token_hash for t in store.tokens()] == ["h1"]
    assert store.find_runtime(drop.id) is None
    assert store.find_runtime(keep.id) == keep


def test_storage_round_trip_keeps_runtimes_index_and_tokens() -> None:
    store = Store()
    record = store.create_runtime("t", now=NOW, name="saved", labels={"sub": ["a", "b"]})
    store.add_token(
        ConnectorTokenRecord(
            token_hash="h",
            kind=TokenKind.CSR,
            runtime_id=record.id,
            tenant="t",
            created_at=NOW,
            expires_at=NOW + timedelta(minutes=5),
        )
    )
    restored = Store()
    restored.load_storage(store.to_storage())
    page, total = restored.list_runtimes(
        "t", parse_filters([{"key": "sub", "query": '"b"'}]), offset=0, limit=10
    )
    assert (page, total) == ([record], 1)
    assert restored.tokens(record.id) == store.tokens(record.id)
    restored.delete_runtime("t", record.id)
    assert restored.tokens() == []


def test_a_runtime_is_seen_by_its_owner_and_parents_only() -> None:
    store = Store()
    owned = store.create_runtime("sa", now=NOW, parents=("ga",), name="rt", labels={"k": "v"})
    for tenant in ("sa", "ga"):
        assert store.get_runtime(tenant, owned.id) == owned
        assert [r.id for r in store.runtimes(tenant)] == [owned.id]
        page, total = store.list_runtimes(tenant, parse_filters([{"key": "k"}]), offset=0, limit=5)
        assert ([r.id for r in page], total) == ([owned.id], 1)
    assert store.get_runtime("other", owned.id) is None
    store.replace_runtime(owned.model_copy(update={"labels": {"k": "w"}}))
    assert (
        store.list_runtimes("ga", parse_filters([{"key": "k", "query": '"v"'}]), offset=0, limit=5)[
            1
        ]
        == 0
    )
    assert store.delete_runtime("ga", owned.id) is not None
    assert store.runtimes("sa") == store.runtimes("ga") == []


def test_adopted_subaccounts_keep_their_first_parent_and_survive_a_save() -> None:
    store = Store()
    assert store.adopt_subaccount("sa", "ga-1") == "ga-1"
    assert store.adopt_subaccount("sa", "ga-2") == "ga-1"
    copy = Store()
    copy.load_storage(store.to_storage())
    assert copy.subaccount_parent("sa") == "ga-1"
    copy.clear()
    assert copy.subaccount_parent("sa") is None
