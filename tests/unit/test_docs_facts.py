"""The docs' fact check (devenv.docs_facts) finds a dropped name, setting, metric, number and
command, and accepts a fact that moved to another file or lost its backticks."""

from __future__ import annotations

from devenv.docs_facts import facts, missing

OLD = """# Broker
The broker answers 503 `compass-unavailable` after `BROKER_QUEUE_TIMEOUT_SECONDS` (20 s)
and counts it in broker_tokens_total.

```sh
make demo DEMO_ARGS=--agent-pod
```
"""


def test_every_kind_of_fact_is_found() -> None:
    found = {fact.text for fact in facts("docs/broker.md", OLD)}
    assert found == {
        "compass-unavailable",
        "BROKER_QUEUE_TIMEOUT_SECONDS",
        "20 s",
        "broker_tokens_total",
        "make demo DEMO_ARGS=--agent-pod",
    }


def test_a_dropped_fact_is_missing_and_a_moved_one_is_not() -> None:
    new = "See compass-unavailable in `BROKER_QUEUE_TIMEOUT_SECONDS` (20\ns), broker_tokens_total."
    lost = missing(facts("docs/broker.md", OLD), new)
    assert [(fact.text, fact.line) for fact in lost] == [("make demo DEMO_ARGS=--agent-pod", 6)]
