"""Merging the workers' Prometheus expositions into the gateway's one."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandgate.proxy.admin.metrics_merge import merge_expositions, render

COUNTER = """\
# HELP sandgate_decisions_total Decisions
# TYPE sandgate_decisions_total counter
sandgate_decisions_total{{tenant="t1",decision="allow"}} {a}
sandgate_decisions_total{{tenant="t1",decision="deny"}} {b}
"""

HISTOGRAM = """\
# HELP sandgate_decision_seconds Time spent deciding
# TYPE sandgate_decision_seconds histogram
sandgate_decision_seconds_bucket{{le="0.001"}} {low}
sandgate_decision_seconds_bucket{{le="+Inf"}} {count}
sandgate_decision_seconds_count {count}
sandgate_decision_seconds_sum {total}
"""

GAUGE = """\
# HELP sandgate_active_connections Open client connections
# TYPE sandgate_active_connections gauge
sandgate_active_connections {n}
"""

INFO = """\
# HELP sandgate_policy_version_info The policy version in force
# TYPE sandgate_policy_version_info gauge
sandgate_policy_version_info{{version="{v}"}} 1.0
"""

FILE_ERRORS = """\
# HELP sandgate_policy_file_errors Policy files that did not load
# TYPE sandgate_policy_file_errors gauge
sandgate_policy_file_errors{{file="{f}",tenant="t2",kept="true"}} 1.0
"""

CREATED = """\
# HELP sandgate_decisions_created Decisions
# TYPE sandgate_decisions_created gauge
sandgate_decisions_created{{tenant="t1"}} {t}
"""


def samples(texts: list[str]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, labels) → value of the merged exposition, read back by Prometheus' parser."""
    out = {}
    for family in text_string_to_metric_families(render(merge_expositions(texts)).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


CASES = [
    pytest.param(
        [COUNTER.format(a=3, b=1), COUNTER.format(a=4, b=0)],
        {
            ("sandgate_decisions_total", (("decision", "allow"), ("tenant", "t1"))): 7.0,
            ("sandgate_decisions_total", (("decision", "deny"), ("tenant", "t1"))): 1.0,
        },
        id="counters are summed per label set",
    ),
    pytest.param(
        [COUNTER.format(a=3, b=1), COUNTER.format(a=1, b=1).replace('"t1"', '"t9"')],
        {
            ("sandgate_decisions_total", (("decision", "allow"), ("tenant", "t1"))): 3.0,
            ("sandgate_decisions_total", (("decision", "deny"), ("tenant", "t1"))): 1.0,
            ("sandgate_decisions_total", (("decision", "allow"), ("tenant", "t9"))): 1.0,
            ("sandgate_decisions_total", (("decision", "deny"), ("tenant", "t9"))): 1.0,
        },
        id="a label set only one worker has is kept as it is",
    ),
    pytest.param(
        [HISTOGRAM.format(low=2, count=3, total=0.5), HISTOGRAM.format(low=1, count=5, total=1.25)],
        {
            ("sandgate_decision_seconds_bucket", (("le", "0.001"),)): 3.0,
            ("sandgate_decision_seconds_bucket", (("le", "+Inf"),)): 8.0,
            ("sandgate_decision_seconds_count", ()): 8.0,
            ("sandgate_decision_seconds_sum", ()): 1.75,
        },
        id="histogram buckets, sums and counts are summed",
    ),
    pytest.param(
        [GAUGE.format(n=5), GAUGE.format(n=7), GAUGE.format(n=0)],
        {("sandgate_active_connections", ()): 12.0},
        id="a gauge that is a level of each worker is summed",
    ),
    pytest.param(
        [INFO.format(v="abc"), INFO.format(v="abc")],
        {("sandgate_policy_version_info", (("version", "abc"),)): 1.0},
        id="an info gauge the workers agree on is one sample with value 1",
    ),
    pytest.param(
        [INFO.format(v="abc"), INFO.format(v="def")],
        {
            ("sandgate_policy_version_info", (("version", "abc"),)): 1.0,
            ("sandgate_policy_version_info", (("version", "def"),)): 1.0,
        },
        id="workers serving different policy versions show one sample per version",
    ),
    pytest.param(
        [FILE_ERRORS.format(f="t2.yaml"), FILE_ERRORS.format(f="t2.yaml")],
        {("sandgate_policy_file_errors", (("file", "t2.yaml"), ("kept", "true"), ("tenant", "t2"))): 1.0},
        id="a broken policy file every worker reports is counted once",
    ),
    pytest.param(
        [CREATED.format(t="1700000100.0"), CREATED.format(t="1700000000.0")],
        {("sandgate_decisions_created", (("tenant", "t1"),)): 1700000000.0},
        id="created timestamps take the earliest worker's",
    ),
    pytest.param(
        [COUNTER.format(a=2, b=2) + GAUGE.format(n=1), ""],
        {
            ("sandgate_decisions_total", (("decision", "allow"), ("tenant", "t1"))): 2.0,
            ("sandgate_decisions_total", (("decision", "deny"), ("tenant", "t1"))): 2.0,
            ("sandgate_active_connections", ()): 1.0,
        },
        id="an empty exposition adds nothing",
    ),
]


@pytest.mark.parametrize(("texts", "expected"), CASES)
def test_merge(texts: list[str], expected: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> None:
    assert samples(texts) == expected


def test_the_merged_exposition_keeps_help_and_type_lines() -> None:
    text = render(merge_expositions([COUNTER.format(a=1, b=0), HISTOGRAM.format(low=0, count=1, total=2)]))
    lines = text.decode().splitlines()
    assert "# TYPE sandgate_decisions_total counter" in lines
    assert "# HELP sandgate_decisions_total Decisions" in lines
    assert "# TYPE sandgate_decision_seconds histogram" in lines
    assert 'sandgate_decision_seconds_bucket{le="+Inf"} 1.0' in lines
