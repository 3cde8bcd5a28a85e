"""`ask` rules end to end: a real gateway holds a request (HTTP, or a CONNECT) until an operator
decides with `sandgate requests`, against real upstreams that count what reaches them."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from typing import Any

import pytest
import yaml
from conftest import SANDGATE, TOKEN_REF, GatewayFactory, RunningGateway
from support import RecordingUpstream, TestPKI

pytestmark = pytest.mark.slow


def asking_tenant(port: int, *, unmatched: str = "deny") -> str:
    """Tenant t1 (sandbox sb1): GET /open allowed; anything else on api.test:`port` is asked about."""
    return yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
            "allow": [{"id": "open", "hosts": ["api.test"], "ports": [port], "paths": ["/open"]}],
            "ask": [{"id": "api", "hosts": ["api.test", "pass.test"], "ports": [port]}],
            "unmatched": unmatched,
        },
        sort_keys=False,
    )


def sandgate(gw: RunningGateway, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, *args, "--config", str(gw.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=30,
    )


def held(
    gw: RunningGateway, count: int = 1, *, state: str = "held", timeout: float = 15.0
) -> list[dict[str, Any]]:
    """The gateway's open access requests in `state`, once there are `count` of them."""
    deadline = time.monotonic() + timeout
    while True:
        out = sandgate(gw, "requests", "list", "--format", "json")
        assert out.returncode == 0, out.stderr
        found = [r for r in json.loads(out.stdout)["requests"] if r["state"] == state]
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"expected {count} {state} requests, found {found}"
        time.sleep(0.1)


def start_curl(gw: RunningGateway, url: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["curl", "-sS", "-m", "30", "-x", gw.proxy(), "-o", "-", "-w", "\n%{http_code}", *extra, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def about(records: list[dict[str, Any]], approval_id: str) -> list[dict[str, Any]]:
    """The records of one held request: asked about (`approval_id`), then ended (`approval`);
    on a shared gateway, never an earlier test's record written after this test began."""
    return [
        r
        for r in records
        if r.get("approval_id") == approval_id or (r.get("approval") or {}).get("id") == approval_id
    ]


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=40)
    body, _, code = out.rpartition("\n")
    return int(code), body


@pytest.fixture(scope="module")
def shared(start_module_gateway: GatewayFactory, http_upstream: RecordingUpstream) -> RunningGateway:
    return start_module_gateway(
        {"t1.yaml": asking_tenant(http_upstream.port)},
        # One worker: the cap is per worker (the two-worker test below runs its own gateway).
        config={"approvals": {"max_held_per_sandbox": 2}, "workers": {"count": 1}},
    )


@pytest.fixture
def gw(shared: RunningGateway, http_upstream: RecordingUpstream) -> RunningGateway:
    shared.mark()
    http_upstream.reset()
    return shared


def test_a_held_request_approved_through_the_cli_is_released_once(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    curl = start_curl(gw, f"http://api.test:{http_upstream.port}/v1/items?token=s3cret")
    [pending] = held(gw)
    assert (pending["tenant"], pending["sandbox"], pending["host"], pending["method"], pending["path"]) == (
        "t1",
        "sb1",
        "api.test",
        "GET",
        "/v1/items?token=REDACTED",
    )
    assert pending["rule_id"] == "t1/ask/api"
    assert http_upstream.requests == [], "nothing reaches the upstream while it is held"
    shown = sandgate(gw, "requests", "show", pending["id"])
    assert shown.returncode == 0 and "state: held" in shown.stdout

    approved = sandgate(gw, "requests", "approve", pending["id"], "--format", "json")
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["state"] == "approved"
    status, body = finish(curl)
    assert status == 200, body
    assert [r.target for r in http_upstream.wait_for_requests(1)] == ["/v1/items?token=s3cret"]
    time.sleep(0.3)
    assert len(http_upstream.requests) == 1, "released exactly once"

    ask, end = about(gw.records_until(lambda rs: len(about(rs, pending["id"])) >= 2), pending["id"])
    assert (ask["decision"], ask["reason"], ask["approval_id"], ask["rule_id"]) == (
        "ask",
        "approval_required",
        pending["id"],
        "t1/ask/api",
    )
    assert (end["decision"], end["reason"], end["status"]) == ("allow", "allowed", 200)
    assert end["approval"]["id"] == pending["id"] and end["approval"]["by"]
    # A second decision on it is refused.
    again = sandgate(gw, "requests", "deny", pending["id"])
    assert again.returncode == 1 and "already approved" in again.stderr
    # `audit query --reason approval_required` lists the held one.
    query = sandgate(gw, "audit", "query", "--reason", "approval_required", "--format", "json")
    assert query.returncode == 0, query.stderr
    listed = [json.loads(line) for line in query.stdout.splitlines() if line.strip()]
    assert pending["id"] in [r.get("approval_id") for r in listed]


def test_an_allowed_request_is_never_held(gw: RunningGateway, http_upstream: RecordingUpstream) -> None:
    status, _ = finish(start_curl(gw, f"http://api.test:{http_upstream.port}/open"))
    assert status == 200
    assert len(http_upstream.requests) == 1


def test_a_denied_request_gets_403_approval_denied(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    curl = start_curl(gw, f"http://api.test:{http_upstream.port}/v1/secret", "-i")
    [pending] = held(gw)
    denied = sandgate(gw, "requests", "deny", pending["id"], "--reason", "not this one")
    assert denied.returncode == 0, denied.stderr
    status, body = finish(curl)
    assert status == 403 and "x-sandgate-reason: approval_denied" in body.lower()
    assert http_upstream.requests == []
    end = about(gw.records_until(lambda rs: len(about(rs, pending["id"])) >= 2), pending["id"])[-1]
    assert (end["decision"], end["reason"], end["approval"]["id"]) == (
        "deny",
        "approval_denied",
        pending["id"],
    )
    shown = json.loads(sandgate(gw, "requests", "show", pending["id"], "--format", "json").stdout)
    assert (shown["state"], shown["reason"]) == ("denied", "not this one")


def test_past_the_cap_a_request_is_refused_at_once(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    first = [start_curl(gw, f"http://api.test:{http_upstream.port}/v1/{i}") for i in range(2)]
    pending = held(gw, 2)
    started = time.monotonic()
    status, body = finish(start_curl(gw, f"http://api.test:{http_upstream.port}/v1/third"))
    assert (status, json.loads(body)["reason"]) == (403, "approval_queue_full")
    assert time.monotonic() - started < 5
    for p in pending:
        assert sandgate(gw, "requests", "deny", p["id"]).returncode == 0
    assert [finish(c)[0] for c in first] == [403, 403]
    assert http_upstream.requests == []


def test_a_client_that_hangs_up_leaves_its_request_listed(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    curl = start_curl(gw, f"http://api.test:{http_upstream.port}/v1/gone")
    [pending] = held(gw)
    curl.kill()
    curl.communicate(timeout=10)
    [gone] = [r for r in held(gw, state="client_gone") if r["id"] == pending["id"]]
    # Decided after its client left: nothing is released.
    assert sandgate(gw, "requests", "approve", gone["id"]).returncode == 0
    time.sleep(0.5)
    assert http_upstream.requests == []
    end = about(gw.records_until(lambda rs: len(about(rs, pending["id"])) >= 2), pending["id"])[-1]
    assert (end["decision"], end["reason"], end["approval"]["id"]) == (
        "deny",
        "approval_required",
        pending["id"],
    )


def test_a_held_connect_approved_opens_the_tunnel(
    start_gateway: GatewayFactory, https_upstream: RecordingUpstream, pki: TestPKI
) -> None:
    gw = start_gateway({"t1.yaml": asking_tenant(https_upstream.port)})
    curl = start_curl(gw, f"https://pass.test:{https_upstream.port}/tunnel", "--cacert", str(pki.ca_file))
    [pending] = held(gw)
    assert (pending["phase"], pending["method"], pending["host"]) == ("connect", None, "pass.test")
    assert https_upstream.connections == []
    assert sandgate(gw, "requests", "approve", pending["id"]).returncode == 0
    status, body = finish(curl)
    assert status == 200, body
    assert [r.target for r in https_upstream.requests] == ["/tunnel"]
    records = gw.records_until(lambda rs: len(rs) >= 3)
    assert [(r["phase"], r["decision"]) for r in records[:3]] == [
        ("connect", "ask"),
        ("connect", "allow"),
        ("tls", "allow"),
    ]
    assert records[1]["approval"]["id"] == pending["id"]


def test_a_request_not_decided_in_time_gets_approval_timeout(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway(
        {"t1.yaml": asking_tenant(http_upstream.port)},
        config={"approvals": {"ask_timeout_seconds": 1}},
    )
    status, body = finish(start_curl(gw, f"http://api.test:{http_upstream.port}/late"))
    assert (status, json.loads(body)["reason"]) == (403, "approval_timeout")
    assert http_upstream.requests == []
    records = gw.records_until(lambda rs: len(rs) >= 2)
    assert [(r["decision"], r["reason"], r["rule_id"]) for r in records[:2]] == [
        ("ask", "approval_required", "t1/ask/api"),
        ("deny", "approval_timeout", "t1/ask/api"),
    ]
    metrics = subprocess.run(
        ["curl", "-sS", "--unix-socket", str(gw.root / "state" / "admin.sock"), "http://sandgate/metrics"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert 'sandgate_approval_outcomes_total{outcome="expired"} 1.0' in metrics
    assert "sandgate_approvals_held 0.0" in metrics


def test_with_two_workers_the_lead_decides_for_the_worker_that_holds_it(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway({"t1.yaml": asking_tenant(http_upstream.port)}, config={"workers": {"count": 2}})
    curls, pending = [], []
    # Connections land on either worker (SO_REUSEPORT): ask until worker 1 holds one.
    for i in range(12):
        curls.append(start_curl(gw, f"http://api.test:{http_upstream.port}/w/{i}"))
        pending = held(gw, len(curls))
        if any(p["worker"] == 1 for p in pending):
            break
        if len(curls) == 8:
            for p in pending:
                sandgate(gw, "requests", "deny", p["id"])
            for c in curls:
                finish(c)
            curls, pending = [], []
    [on_peer] = [p for p in pending if p["worker"] == 1]
    assert sandgate(gw, "requests", "approve", on_peer["id"]).returncode == 0
    for p in pending:
        if p["id"] != on_peer["id"]:
            assert sandgate(gw, "requests", "deny", p["id"]).returncode == 0
    results = [finish(c)[0] for c in curls]
    assert results.count(200) == 1 and results.count(403) == len(curls) - 1
    assert [r.target for r in http_upstream.wait_for_requests(1)] == [on_peer["path"]]
    missing = sandgate(gw, "requests", "approve", "0123456789abcdef0123")
    assert missing.returncode == 1 and "no access request" in missing.stderr
    # An unset shell variable (`approve "$ID"`) is named as such, not as the admin API's path.
    for command in ("show", "approve", "deny"):
        empty = sandgate(gw, "requests", command, "")
        assert (empty.returncode, empty.stderr) == (
            2,
            "sandgate: an empty request id: `sandgate requests list` shows them\n",
        ), command


def test_a_guest_that_asks_and_hangs_up_fills_only_its_own_queue(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    """Requests whose client hung up stay open until decided or expired, and count: asking in a
    loop and hanging up cannot grow the listing (or the trail) without bound."""
    for i in range(2):
        curl = start_curl(gw, f"http://api.test:{http_upstream.port}/v1/loop{i}")
        held(gw, 1)
        curl.kill()
        curl.communicate(timeout=10)
        held(gw, i + 1, state="client_gone")
    status, body = finish(start_curl(gw, f"http://api.test:{http_upstream.port}/v1/loop-more"))
    assert (status, json.loads(body)["reason"]) == (403, "approval_queue_full")
    gone = held(gw, 2, state="client_gone")
    for request in gone:
        assert sandgate(gw, "requests", "deny", request["id"]).returncode == 0
    assert http_upstream.requests == []
    # `audit query --decision ask` lists what was asked.
    query = sandgate(gw, "audit", "query", "--decision", "ask", "--format", "json")
    assert query.returncode == 0, query.stderr
    asked = {json.loads(line)["approval_id"] for line in query.stdout.splitlines() if line.strip()}
    assert {r["id"] for r in gone} <= asked


def test_an_approved_request_cannot_mean_another_method(
    gw: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    """The operator approves the request as listed (a GET): an override header that makes it
    mean DELETE is decided too, and refused, since no allow rule allows it."""
    curl = start_curl(
        gw, f"http://api.test:{http_upstream.port}/v1/items", "-H", "X-HTTP-Method-Override: DELETE"
    )
    [pending] = held(gw)
    assert pending["method"] == "GET"
    assert sandgate(gw, "requests", "approve", pending["id"]).returncode == 0
    status, body = finish(curl)
    assert status == 403, body
    assert "DELETE" in json.loads(body).get("detail", "") or json.loads(body)["reason"] == "approval_required"
    time.sleep(0.3)
    assert http_upstream.requests == [], "nothing reached the upstream"


def test_a_drain_answers_held_requests_at_once_with_one_cut_record_each(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    # Two workers, a drain far longer than the test waits: held guests must not wait it out.
    gw = start_gateway(
        {"t1.yaml": asking_tenant(http_upstream.port)},
        config={"workers": {"count": 2}, "shutdown": {"drain_seconds": 60}},
    )
    curls = [start_curl(gw, f"http://api.test:{http_upstream.port}/held/{i}") for i in range(4)]
    asked = held(gw, 4)
    started = time.monotonic()
    gw.proc.send_signal(signal.SIGTERM)
    results = [finish(c) for c in curls]
    assert time.monotonic() - started < 10, "held guests waited for the drain"
    assert [code for code, _ in results] == [503] * 4
    assert all(json.loads(body)["reason"] == "internal_error" for _, body in results)
    assert gw.proc.wait(30) == 0
    assert http_upstream.requests == [], "nothing held went upstream"
    ends = [r for r in gw.records() if r.get("approval") and r["decision"] != "ask"]
    assert sorted(r["approval"]["id"] for r in ends) == sorted(a["id"] for a in asked), "one end each"
    assert {(r["decision"], r["status"], r["error"]) for r in ends} == {("deny", 503, "cut by shutdown")}
    assert "the client hung up" not in json.dumps(ends)
