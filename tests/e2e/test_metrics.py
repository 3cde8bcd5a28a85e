"""/metrics of a real gateway counts real decisions with the right labels; gauges read live state."""

from __future__ import annotations

import socket
import time
from collections import Counter

import httpx
import pytest
from conftest import GatewayFactory, RunningGateway, tenant_yaml
from prometheus_client.parser import text_string_to_metric_families
from support import RecordingUpstream

from sandgate.proxy.metrics import GatewayGauges, Metrics

pytestmark = pytest.mark.slow


def scrape(gw: RunningGateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    transport = httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock"))
    with httpx.Client(transport=transport, base_url="http://sandgate") as c:
        resp = c.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }


def decisions(tenant: str, reason: str, phase: str, decision: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    labels = {"tenant": tenant, "reason": reason, "phase": phase, "decision": decision}
    return ("sandgate_decisions_total", tuple(sorted(labels.items())))


def test_metrics_count_real_decisions(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)})
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        for i in range(3):
            assert c.get(f"{http_upstream.url_for('api.test')}/ok{i}").status_code == 200
        assert c.get(f"{http_upstream.url_for('other.test')}/no").status_code == 403
    with httpx.Client(proxy=gw.bare_proxy, timeout=10) as anonymous:
        assert anonymous.get(f"{http_upstream.url_for('api.test')}/who").status_code == 407
    gw.records(5)  # every decision recorded
    m = scrape(gw)
    assert m[decisions("t1", "allowed", "request", "allow")] == 3
    assert m[decisions("t1", "host_not_allowed", "request", "deny")] == 1
    assert m[decisions("-", "no_identity", "request", "deny")] == 1
    assert m[("sandgate_decision_seconds_count", ())] >= 4
    assert m[("sandgate_upstream_seconds_count", ())] == 3, "only the upstream's answers are timed"
    assert m[("sandgate_audit_queue_depth", ())] >= 0
    assert m[("sandgate_audit_spooled_records", ())] == 0
    assert m[("sandgate_policy_reload_failures_total", ())] == 0
    version = gw.records(1)[0]["policy_version"]
    assert m[("sandgate_policy_version_info", (("version", version),))] == 1

    # The file watcher picks the broken file up (a SIGHUP too could make it two failures): a
    # broken operator file fails the reload whole.
    (gw.rules_dir / "base.yaml").write_text("deny:\n  - hots: [x.test]\n")
    (failed, *_) = gw.records(1, event="policy_reload", timeout=10)
    assert failed["result"] == "error"
    assert scrape(gw)[("sandgate_policy_reload_failures_total", ())] >= 1


def test_active_connections_are_read_at_scrape_time(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)})
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        assert c.get(f"{http_upstream.url_for('api.test')}/keep").status_code == 200
        assert scrape(gw)[("sandgate_active_connections", ())] == 1, "the keep-alive connection is open"
    deadline = time.monotonic() + 5
    while scrape(gw)[("sandgate_active_connections", ())] != 0:
        assert time.monotonic() < deadline, "the closed connection is still counted"
        time.sleep(0.05)


def _decision_counts(m: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[tuple[str, ...], float]:
    """sandgate_decisions_total as {(tenant, reason, phase, decision): count}, zero counts left out."""
    return {
        (labels["tenant"], labels["reason"], labels["phase"], labels["decision"]): value
        for (name, items), value in m.items()
        if name == "sandgate_decisions_total" and value
        for labels in [dict(items)]
    }


@pytest.mark.parametrize("workers", [1, 2], ids=["one process", "two workers"])
def test_every_counted_decision_has_its_audit_record(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, workers: int
) -> None:
    """A decision is counted once it has a record: a worker's start-up self-tests (a garbage
    request head through the real HTTP error seam) count nothing, while a guest's garbage head
    counts once, with its record."""
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)}, config={"workers": {"count": workers}})
    assert _decision_counts(scrape(gw)) == {}, "a decision counted at start, with no audit record"
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        assert c.get(f"{http_upstream.url_for('api.test')}/ok").status_code == 200
        assert c.get(f"{http_upstream.url_for('other.test')}/no").status_code == 403
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as raw:
        raw.sendall(b"GET / HTTP/1.1 x\r\n\r\n")
        assert raw.recv(4096).startswith(b"HTTP/1.1 400 ")
    records = gw.records(3)
    recorded = Counter((r["tenant"] or "-", r["reason"], r["phase"], r["decision"]) for r in records)
    assert recorded[("-", "invalid_request", "request", "deny")] == 1
    deadline = time.monotonic() + 5  # with workers, the lead merges what each counted
    while (counted := _decision_counts(scrape(gw))) != recorded and time.monotonic() < deadline:
        time.sleep(0.1)
    assert counted == recorded
    # Bytes per tenant and direction, as `sandgate usage` adds them up from the same records.
    recorded_bytes: Counter[tuple[str, str]] = Counter()
    for r in records:
        for direction, n in (r.get("bytes") or {}).items():
            recorded_bytes[(r["tenant"] or "-", direction)] += n or 0
    assert recorded_bytes[("t1", "down")] > 0
    counted_bytes = {
        (dict(items)["tenant"], dict(items)["direction"]): v
        for (name, items), v in scrape(gw).items()
        if name == "sandgate_tenant_bytes_total"
    }
    assert counted_bytes == {k: v for k, v in recorded_bytes.items() if v}


def test_injections_are_counted_by_tenant_and_credential() -> None:
    metrics = Metrics()
    metrics.injected("t1", ("github", "npm"))
    metrics.injected("t1", ("github",))
    metrics.attach(GatewayGauges(lambda: 2, lambda: 7, lambda: "v1", lambda: 0, spooled=lambda: 5))
    samples = {(n, tuple(sorted(labels.items()))): v for n, labels, v in metrics.samples()}
    assert (
        samples[("sandgate_credential_injections_total", (("credential", "github"), ("tenant", "t1")))] == 2
    )
    assert samples[("sandgate_credential_injections_total", (("credential", "npm"), ("tenant", "t1")))] == 1
    assert samples[("sandgate_active_connections", ())] == 2
    assert samples[("sandgate_audit_queue_depth", ())] == 7
    assert samples[("sandgate_audit_spooled_records", ())] == 5
    metrics.detach()
    assert not any(n == "sandgate_active_connections" for n, _, _ in metrics.samples())
