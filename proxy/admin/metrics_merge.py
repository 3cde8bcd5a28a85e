"""One Prometheus exposition for a gateway of several workers, merged from each worker's.

Per sample (name and label set), over the workers that answered:
- counters and histograms (`_total`, `_bucket`, `_sum`, `_count`) and gauges that are
  levels of a part (connections, queue depths, open fds) are summed;
- `_created` timestamps take the earliest;
- gauges that describe the gateway rather than count a part (`*_info`, and the names in
  NOT_SUMMED) are not summed: one sample per distinct label set, with the highest value (1).
A worker restarted since the last scrape starts its counters again from zero, so the sum can
go down once: Prometheus' rate() takes that as a counter reset, as for a restarted process.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

__all__ = ["NOT_SUMMED", "merge_expositions", "render"]

# Gauges about the gateway's files, the same on every worker: flags (1 each), and the grants
# in force (every worker reads the same grants).
NOT_SUMMED = frozenset({"sandgate_policy_file_errors", "sandgate_grants_in_force"})

_SUMMED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram", "gauge", "unknown"})


def _combine(family: Metric, sample_name: str) -> str:
    """How one sample is merged: "sum", "min" or "max"."""
    if sample_name.endswith("_created"):
        return "min"
    if family.type == "info" or family.name.endswith("_info") or family.name in NOT_SUMMED:
        return "max"
    return "sum" if family.type in _SUMMED_TYPES else "max"


def merge_expositions(texts: Sequence[str]) -> list[Metric]:
    """The metric families of several workers' expositions, merged (first seen order)."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            into = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                old = into.get(key)
                if old is None:
                    into[key] = sample.value
                    continue
                how = _combine(merged, sample.name)
                if how == "sum":
                    into[key] = old + sample.value
                elif how == "min":
                    into[key] = min(old, sample.value)
                else:
                    into[key] = max(old, sample.value)
    out = []
    for name, merged in families.items():
        for (sample_name, labels), value in values[name].items():
            merged.add_sample(sample_name, dict(labels), value)
        out.append(merged)
    return out


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def render(families: Iterable[Metric]) -> bytes:
    """The Prometheus text format of these families."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)
