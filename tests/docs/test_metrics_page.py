"""docs/operations/metrics.md names every metric the gateway exports, and its example alert
rules use no metric the gateway does not export (a renamed metric would silence an alert)."""

from __future__ import annotations

import re
from typing import Any

import yaml
from conftest import REPO
from prometheus_client.core import Metric

from sandgate.proxy.metrics import GatewayGauges, Metrics

PAGE = REPO / "docs" / "operations" / "metrics.md"
# Added by the lead of a gateway with workers to its merged exposition (proxy/admin/fanout.py).
LEAD_ONLY = ("sandgate_workers", "sandgate_workers_ready")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "info": ("",)}


def exported() -> dict[str, set[str]]:
    """Each exported family (as the page names it: counters with `_total`) and its sample names."""
    metrics = Metrics()
    metrics.attach(
        GatewayGauges(
            connections=lambda: 0,
            audit_depth=lambda: 0,
            policy_version=lambda: "v",
            reload_failures=lambda: 0,
        )
    )
    families: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        families[_shown(family)] = {family.name + s for s in SUFFIXES[family.type]}
    for name in LEAD_ONLY:
        families[name] = {name}
    return families


def _shown(family: Metric) -> str:
    return family.name + "_total" if family.type == "counter" else family.name


def rules() -> dict[str, Any]:
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.DOTALL)
    (block,) = [b for b in blocks if b.startswith("groups:")]
    loaded: dict[str, Any] = yaml.safe_load(block)
    return loaded


def test_the_lead_only_metrics_are_still_made_by_the_lead() -> None:
    fanout = (REPO / "proxy" / "admin" / "fanout.py").read_text()
    assert all(f'"{name}"' in fanout for name in LEAD_ONLY)


def test_every_exported_metric_is_on_the_page() -> None:
    tables = {m for m in re.findall(r"^\| `(sandgate_\w+)` \|", PAGE.read_text(), re.MULTILINE)}
    assert tables == set(exported()), "update the tables of docs/operations/metrics.md"


def test_every_alert_uses_exported_metrics_and_says_what_to_do() -> None:
    samples = set().union(*exported().values())
    groups = rules()["groups"]
    alerts = [rule for group in groups for rule in group["rules"]]
    assert len(alerts) >= 10
    for rule in alerts:
        used = set(re.findall(r"\bsandgate_\w+", rule["expr"]))
        assert used <= samples, f"{rule['alert']}: {used - samples} is not exported"
        assert rule["labels"]["severity"] in ("page", "ticket"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
    assert len({rule["alert"] for rule in alerts}) == len(alerts)
