"""Waiting time and usage of access requests: the end record's `waited_seconds`, the
`sandgate_approval_wait_seconds` histogram and `sandgate audit stats`, after a real gateway held
requests that were approved, denied, expired and whose client hung up."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import SANDGATE, TOKEN_REF, GatewayFactory, RunningGateway
from prometheus_client.parser import text_string_to_metric_families
from support import RecordingUpstream

from sandgate.proxy.cli.main import main

TIMEOUT = 3.0


def asking_tenant(port: int) -> str:
    return yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
            "ask": [{"id": "api", "hosts": ["api.test"], "ports": [port]}],
        },
        sort_keys=False,
    )


def start_curl(gw: RunningGateway, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["curl", "-sS", "-m", "30", "-x", gw.proxy(), "-o", "/dev/null", "-w", "%{http_code}", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def admin(gw: RunningGateway) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock")), timeout=10)


def one_open(gw: RunningGateway, path: str, state: str = "held") -> dict[str, Any]:
    """The open access request for `path`, once it is in `state`."""
    deadline = time.monotonic() + 15
    with admin(gw) as client:
        while True:
            found = [
                r
                for r in client.get("http://sandgate/v1/access-requests").json()["requests"]
                if r["path"] == path and r["state"] == state
            ]
            if found:
                return dict(found[0])
            assert time.monotonic() < deadline, f"no {state} request for {path}"
            time.sleep(0.02)


def decide(gw: RunningGateway, request_id: str, verb: str) -> None:
    with admin(gw) as client:
        answer = client.post(f"http://sandgate/v1/access-requests/{request_id}/{verb}", json={"by": "ops"})
        assert answer.status_code == 200, answer.text


def gauge(gw: RunningGateway, name: str) -> float:
    with admin(gw) as client:
        text = client.get("http://sandgate/metrics").text
    [value] = [float(line.split(" ")[1]) for line in text.splitlines() if line.startswith(f"{name} ")]
    return value


def wait_metrics(gw: RunningGateway) -> dict[tuple[str, str, str | None], float]:
    """The `sandgate_approval_wait_seconds` samples for tenant t1, by (sample, outcome, le)."""
    with admin(gw) as client:
        text = client.get("http://sandgate/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        if family.name == "sandgate_approval_wait_seconds":
            for sample in family.samples:
                labels = dict(sample.labels)
                assert set(labels) <= {"tenant", "outcome", "le"}, "no sandbox label"
                assert labels["tenant"] == "t1"
                samples[(sample.name.rpartition("_")[2], labels["outcome"], labels.get("le"))] = sample.value
    return samples


@pytest.mark.slow
def test_held_approved_denied_expired_and_gone_are_timed_and_counted(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    # The tenant's grants file: one grant in force, one expired (for a path never asked about).
    grants = {
        "tenant": "t1",
        "grants": [
            {
                "id": "00aa11bb22cc",
                "host": "api.test",
                "port": http_upstream.port,
                "methods": ["*"],
                "paths": ["/granted"],
            },
            {
                "id": "00aa11bb22cd",
                "host": "api.test",
                "port": http_upstream.port,
                "methods": ["*"],
                "paths": ["/old"],
                "expires": "2020-01-01T00:00:00Z",
            },
        ],
    }
    gw = start_gateway(
        {"t1.yaml": asking_tenant(http_upstream.port), "t1.grants.yaml": yaml.safe_dump(grants)},
        config={"approvals": {"ask_timeout_seconds": TIMEOUT}},
    )
    assert gauge(gw, "sandgate_grants_in_force") == 1
    url = f"http://api.test:{http_upstream.port}"
    approved = start_curl(gw, f"{url}/approved")
    held = one_open(gw, "/approved")["id"]
    time.sleep(0.3)  # held a moment: its wait is at least this
    decide(gw, held, "approve")
    denied = start_curl(gw, f"{url}/denied")
    decide(gw, one_open(gw, "/denied")["id"], "deny")
    gone = start_curl(gw, f"{url}/gone")
    one_open(gw, "/gone")
    gone.kill()
    gone.communicate(timeout=10)
    one_open(gw, "/gone", state="client_gone")
    expired = start_curl(gw, f"{url}/expired")
    assert [c.communicate(timeout=40)[0] for c in (approved, denied, expired)] == ["200", "403", "403"]

    ends = {
        r["path"]: r
        for r in gw.records_until(lambda rs: sum(1 for r in rs if r.get("approval")) >= 4)
        if r.get("approval")
    }
    waited = {path: r["approval"]["waited_seconds"] for path, r in ends.items()}
    assert 0.3 <= waited["/approved"] < TIMEOUT
    assert 0 < waited["/denied"] < TIMEOUT and 0 < waited["/gone"] < TIMEOUT
    assert TIMEOUT <= waited["/expired"] < TIMEOUT + 2
    assert ends["/approved"]["approval"]["by"] == "ops"

    samples = wait_metrics(gw)
    for outcome in ("approved", "denied", "expired", "client_gone"):
        assert samples[("count", outcome, None)] == 1, outcome
    assert samples[("sum", "expired", None)] >= TIMEOUT
    assert samples[("bucket", "approved", "0.25")] == 0
    assert samples[("bucket", "approved", "5.0")] == 1

    # The client-gone request expires later, unheld: its time held stays the time until it hung up.
    time.sleep(TIMEOUT)
    with admin(gw) as client:
        assert client.get("http://sandgate/v1/access-requests").json()["requests"] == []
    assert wait_metrics(gw)[("count", "client_gone", None)] == 1

    out = subprocess.run(
        [SANDGATE, "audit", "stats", "--config", str(gw.root / "sandgate.yaml"), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    [entry] = json.loads(out.stdout)["approvals"]
    assert (entry["tenant"], entry["sandbox"], entry["asks"], entry["grants"]) == ("t1", "sb1", 4, 0)
    assert entry["outcomes"] == {"approved": 1, "client_gone": 1, "denied": 1, "expired": 1}
    held = entry["held_seconds"]
    assert held["count"] == 4 and held["max"] == waited["/expired"]
    assert held["p50"] <= held["p99"] <= held["max"]


def write_trail(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def ask(sandbox: str, n: int) -> dict[str, Any]:
    return {
        "event": "decision",
        "time": "2026-12-01T10:00:00.000Z",
        "decision_id": f"a{sandbox}{n}",
        "tenant": "t1",
        "sandbox": sandbox,
        "decision": "ask",
        "reason": "approval_required",
        "approval_id": f"q{sandbox}{n}",
    }


def end(sandbox: str, n: int, reason: str, waited: float | None) -> dict[str, Any]:
    approval: dict[str, Any] = {"id": f"q{sandbox}{n}", "by": "ops"}
    if waited is not None:
        approval["waited_seconds"] = waited
    return {
        "event": "decision",
        "time": "2026-12-01T10:00:01.000Z",
        "decision_id": f"e{sandbox}{n}",
        "tenant": "t1",
        "sandbox": sandbox,
        "decision": "allow" if reason == "allowed" else "deny",
        "reason": reason,
        "approval": approval,
    }


def test_stats_count_asks_outcomes_grants_and_time_held_per_sandbox(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records: list[dict[str, Any]] = []
    # sb1: 100 approved asks held 1..100 s, one queue_full, two grants, and a request inside an
    # approved tunnel (its approval carries no time: it was not held, and is not counted).
    for n in range(1, 101):
        records += [ask("sb1", n), end("sb1", n, "allowed", float(n))]
    records.append({**end("sb1", 0, "approval_queue_full", None), "approval": None})
    records.append(end("sb1", 101, "allowed", None))
    grant = {"event": "grant", "time": "2026-12-01T10:00:02.000Z", "tenant": "t1", "sandbox": "sb1"}
    records += [{**grant, "action": "made"}, {**grant, "action": "made"}, {**grant, "action": "revoked"}]
    records.append({**grant, "action": "made", "sandbox": None})  # scope tenant
    # sb2: one denied, one expired, one client gone.
    for n, reason in enumerate(("approval_denied", "approval_timeout", "approval_required")):
        records += [ask("sb2", n), end("sb2", n, reason, 0.5 * (n + 1))]
    trail = tmp_path / "audit.jsonl"
    write_trail(trail, records)

    assert main(["audit", "stats", "--file", str(trail), "--format", "json"]) == 0
    tenant_wide, sb1, sb2 = json.loads(capsys.readouterr().out)["approvals"]
    assert (tenant_wide["sandbox"], tenant_wide["asks"], tenant_wide["grants"]) == ("*", 0, 1)
    assert (sb1["sandbox"], sb1["asks"], sb1["outcomes"], sb1["grants"]) == (
        "sb1",
        101,
        {"approved": 100, "queue_full": 1},
        2,
    )
    # Percentiles to within a 5 % bin, never past the largest time.
    assert sb1["held_seconds"]["count"] == 100
    assert 50 <= sb1["held_seconds"]["p50"] <= 50 * 1.05
    assert 99 <= sb1["held_seconds"]["p99"] <= 100
    assert sb1["held_seconds"]["max"] == 100
    assert (sb2["asks"], sb2["outcomes"], sb2["grants"]) == (
        3,
        {"client_gone": 1, "denied": 1, "expired": 1},
        0,
    )
    assert sb2["held_seconds"]["max"] == 1.5

    assert main(["audit", "stats", "--file", str(trail), "--sandbox", "sb2"]) == 0
    table = capsys.readouterr().out
    head, _, line = table.rstrip("\n").rpartition("\n")
    assert head.endswith("approvals per sandbox:")
    # p50 is the upper edge of the 5 % bin holding 1.0 s.
    assert line.startswith("  t1/sb2: 3 asks (client_gone 1, denied 1, expired 1); held p50 1.0")
    assert line.endswith(" p99 1.500s max 1.500s; 0 grants")
