"""A small evaluator of PromQL vector selectors against one scrape: what an alert's data is.

Prometheus evaluates a rule over the series a scrape stored, each carrying the target's labels
(the ServiceMonitor makes the Service's name the `job`, and adds `namespace`, `instance`, ...).
`unmatched` takes each vector selector of an expression (the metric names Prometheus's own
parser found in it, `promql-check`), reads its label matchers (`=`, `!=`, `=~`, `!~`, regexes
anchored as Prometheus anchors them) and returns those that select no sample of the scrape. It
does not evaluate functions, aggregations or comparisons: a selector that selects nothing makes
`increase()`/`rate()` miss the first event and leaves a comparison without an operand, whatever
the rest of the expression does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, operator, value)

    def selects(self, sample: Sample) -> bool:
        if sample.name != self.name:
            return False
        for label, op, value in self.matchers:
            have = sample.labels.get(label, "")  # a missing label matches as the empty string
            if op == "=" and have != value:
                return False
            if op == "!=" and have == value:
                return False
            if op in ("=~", "!~") and (re.fullmatch(value, have) is not None) != (op == "=~"):
                return False
        return True

    def __str__(self) -> str:
        inner = ", ".join(f'{label}{op}"{value}"' for label, op, value in self.matchers)
        return f"{self.name}{{{inner}}}"


def samples(exposition: str, target: Mapping[str, str]) -> list[Sample]:
    """The scrape's samples as Prometheus stores them: with the target's labels added."""
    return [
        Sample(sample.name, {**target, **sample.labels})
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    ]


def selectors(expr: str, names: Iterable[str]) -> list[Selector]:
    """Every selector of `expr` for the metric `names` (as the parser found them)."""
    found: list[Selector] = []
    for name in sorted(set(names)):
        for match in re.finditer(rf"(?<![a-zA-Z0-9_:]){re.escape(name)}(?![a-zA-Z0-9_:])", expr):
            rest = expr[match.end() :].lstrip()
            matchers: list[tuple[str, str, str]] = []
            if rest.startswith("{"):
                body = rest[1 : rest.index("}")]
                position = 0
                while position < len(body):
                    m = _MATCHER.match(body, position)
                    assert m is not None, f"cannot read the matchers of {name} in {expr!r}"
                    label, op, value = m.groups()
                    matchers.append((label, op, value.replace('\\"', '"').replace("\\\\", "\\")))
                    position = m.end()
            found.append(Selector(name, tuple(matchers)))
    return found


def unmatched(expr: str, names: Sequence[str], scrape: Sequence[Sample]) -> list[str]:
    """The selectors of `expr` that select no sample of `scrape`."""
    return [str(s) for s in selectors(expr, names) if not any(s.selects(x) for x in scrape)]
