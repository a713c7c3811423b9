"""Figures read from Prometheus text: requests a kube-apiserver served, from its own
`/metrics` (`apiserver_request_total`), and the unlabelled samples (gauges) of the broker's
`/metrics`.

Holds: the count is what the API server saw, whoever sent it, so a phase's delta counts the
broker's requests only while nothing else talks to that API server (the benchmark does not
during a measured phase); non-resource requests (`/metrics`, `/readyz`) carry no resource and
are left out, so reading the metrics does not count itself. Keys are `VERB resource[/sub]`,
e.g. `PATCH compassmanagermappings/status`, `POST events`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

METRIC = "apiserver_request_total"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>.*)\}\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def parse_request_counts(metrics_text: str) -> dict[str, int]:
    """`VERB resource[/subresource]` -> requests served so far, summed over codes and groups."""
    counts: dict[str, int] = {}
    for line in metrics_text.splitlines():
        if not line.startswith(METRIC + "{"):
            continue
        match = _SAMPLE.match(line)
        if match is None or match["name"] != METRIC:
            continue
        labels = {m["key"]: m["value"] for m in _LABEL.finditer(match["labels"])}
        resource = labels.get("resource", "")
        if not resource:
            continue
        sub = labels.get("subresource", "")
        key = f"{labels.get('verb', '?')} {resource}{'/' + sub if sub else ''}"
        counts[key] = counts.get(key, 0) + int(float(match["value"]))
    return counts


def unlabelled_samples(metrics_text: str) -> dict[str, float]:
    """Every unlabelled sample `name value` of one scrape, read in one pass: a poll that wants
    several gauges parses the text once. A value that is not a number is left out."""
    samples: dict[str, float] = {}
    for line in metrics_text.splitlines():
        parts = line.split()
        if len(parts) != 2 or line.startswith("#"):
            continue
        try:
            samples.setdefault(parts[0], float(parts[1]))
        except ValueError:
            continue
    return samples


def delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Requests served between two readings, only the keys that changed."""
    out = {k: v - before.get(k, 0) for k, v in after.items()}
    return {k: v for k, v in sorted(out.items()) if v > 0}


@dataclass(frozen=True)
class KcpRequests:
    """Requests the control-plane API server served during one phase, by verb and resource."""

    by_request: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_request.values())

    def _events(self, verbs: tuple[str, ...]) -> int:
        total = 0
        for key, count in self.by_request.items():
            verb, _, resource = key.partition(" ")
            if resource == "events" and verb in verbs:
                total += count
        return total

    @property
    def writes(self) -> int:
        """Every request that changes something (the API server's write verbs)."""
        verbs = ("POST", "PUT", "PATCH", "DELETE", "APPLY", "CREATE", "UPDATE")
        return sum(c for key, c in self.by_request.items() if key.partition(" ")[0] in verbs)

    @property
    def events_created(self) -> int:
        return self._events(("POST", "CREATE"))

    @property
    def events_updated(self) -> int:
        """Events aggregated into an existing one (count + lastTimestamp), as client-go does."""
        return self._events(("PATCH", "PUT", "APPLY", "UPDATE"))
