"""The approvals webhook end to end: a real gateway announces each new access request to a real
receiver on loopback, which checks the signature and timestamp and decides through the admin
API; a receiver that is down or failing neither delays nor breaks the hold."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import TOKEN_REF, GatewayFactory, RunningGateway
from support import RecordingUpstream, free_port

from sandgate.proxy.approvals.webhook import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    load_webhook_secret,
    sign,
    verify,
)
from sandgate.proxy.errors import ConfigError

pytestmark = pytest.mark.slow

SECRET = "whsec-0123456789abcdef-do-not-log"


@dataclass
class Call:
    """One webhook call as the receiver saw it, and what it made of it."""

    body: dict[str, Any]
    delivery: str
    timestamp: str
    genuine: bool
    received: float


@dataclass
class Receiver:
    """A webhook receiver on loopback: checks each call's signature and timestamp, answers with
    the next of `statuses` (then 200), and with `decide` ("approve" or "deny") takes that
    decision through the gateway's admin API (its unix socket) on a genuine 2xx call."""

    statuses: list[int] = field(default_factory=list)
    decide: str | None = None
    admin_socket: Path | None = None
    calls: list[Call] = field(default_factory=list)
    decisions: list[int] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/sandgate"

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        raw = handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
        timestamp = handler.headers.get(TIMESTAMP_HEADER, "")
        genuine = verify(SECRET.encode(), timestamp, raw, handler.headers.get(SIGNATURE_HEADER, ""))
        with self.cond:
            status = self.statuses.pop(0) if self.statuses else 200
        status = status if genuine else 401
        body = json.loads(raw)
        handler.send_response(status)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        if genuine and status < 300 and self.decide is not None and self.admin_socket is not None:
            path = body["admin"][self.decide]
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(self.admin_socket))) as admin:
                answer = admin.post(f"http://sandgate{path}", json={"by": "webhook-bot", "reason": "checked"})
            self.decisions.append(answer.status_code)
        with self.cond:
            self.calls.append(
                Call(body, handler.headers.get(DELIVERY_HEADER, ""), timestamp, genuine, time.time())
            )
            self.cond.notify_all()

    def wait_calls(self, count: int, timeout: float = 20.0) -> list[Call]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.calls) >= count, timeout), self.calls
            return list(self.calls)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            rec.handle(self)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    rec.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=rec.server.serve_forever, daemon=True)
    thread.start()
    yield rec
    rec.server.shutdown()
    rec.server.server_close()


def asking_tenant(port: int) -> str:
    return yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
            "ask": [{"id": "api", "hosts": ["api.test"], "ports": [port]}],
        },
        sort_keys=False,
    )


def start_hooked(
    start_gateway: GatewayFactory, upstream: RecordingUpstream, url: str, **webhook: Any
) -> RunningGateway:
    """A gateway whose webhook posts to `url`, its secret given as an env: reference."""
    return start_gateway(
        {"t1.yaml": asking_tenant(upstream.port)},
        config={"approvals": {"webhook": {"url": url, "secret": "env:SANDGATE_TEST_HOOK", **webhook}}},
        env={"SANDGATE_TEST_HOOK": SECRET},
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


def open_requests(gw: RunningGateway, count: int, timeout: float = 15.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    with admin(gw) as client:
        while True:
            found = client.get("http://sandgate/v1/access-requests").json()["requests"]
            if len(found) >= count:
                return list(found)
            assert time.monotonic() < deadline, found
            time.sleep(0.05)


def metric(gw: RunningGateway, line_start: str) -> float:
    with admin(gw) as client:
        text = client.get("http://sandgate/metrics").text
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_receiver_checks_the_signature_and_approves_through_the_admin_api(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, receiver: Receiver
) -> None:
    receiver.decide = "approve"
    gw = start_hooked(start_gateway, http_upstream, receiver.url)
    receiver.admin_socket = gw.root / "state" / "admin.sock"
    curl = start_curl(gw, f"http://api.test:{http_upstream.port}/v1/items?key=abc")
    [call] = receiver.wait_calls(1)
    out, _ = curl.communicate(timeout=40)
    assert out == "200", "released on the receiver's approval"
    assert [r.target for r in http_upstream.wait_for_requests(1)] == ["/v1/items?key=abc"]

    assert call.genuine, "the signature and timestamp check out"
    assert abs(int(call.timestamp) - call.received) < 30
    request = call.body["request"]
    assert (call.body["event"], call.body["worker"], call.delivery) == (
        "access_request.opened",
        0,
        request["id"],
    )
    assert call.body["gateway"]
    assert (request["tenant"], request["sandbox"], request["host"], request["path"], request["state"]) == (
        "t1",
        "sb1",
        "api.test",
        "/v1/items?key=REDACTED",
        "held",
    )
    assert call.body["admin"] == {
        "show": f"/v1/access-requests/{request['id']}",
        "approve": f"/v1/access-requests/{request['id']}/approve",
        "deny": f"/v1/access-requests/{request['id']}/deny",
    }
    assert receiver.decisions == [200]
    end = gw.records_until(lambda rs: any(r["decision"] == "allow" for r in rs))[-1]
    assert (end["approval"]["id"], end["approval"]["by"]) == (request["id"], "webhook-bot")
    assert 0 < end["approval"]["waited_seconds"] < 30
    assert metric(gw, 'sandgate_approval_webhook_calls_total{result="delivered"}') == 1
    assert SECRET not in gw.log()


def test_a_receiver_that_is_down_does_not_delay_the_hold_and_is_retried(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    port = free_port()
    down = f"http://user:pw-in-url@127.0.0.1:{port}/hook?token=q-secret"
    gw = start_hooked(start_gateway, http_upstream, down, max_attempts=3, timeout_seconds=1)
    started = time.monotonic()
    curl = start_curl(gw, f"http://api.test:{http_upstream.port}/v1/down")
    [pending] = open_requests(gw, 1)
    assert pending["state"] == "held"
    assert time.monotonic() - started < 10
    # Attempts 1 and 2 failed (refused) and were retried (backoff 0.5 s, then 1 s), the third given up.
    deadline = time.monotonic() + 20
    while "approval.webhook_failed" not in gw.log():
        assert time.monotonic() < deadline, gw.log()
        time.sleep(0.1)
    assert metric(gw, 'sandgate_approval_webhook_calls_total{result="retried"}') == 2
    assert metric(gw, 'sandgate_approval_webhook_calls_total{result="failed"}') == 1
    [still] = open_requests(gw, 1)
    assert (still["id"], still["state"]) == (pending["id"], "held"), "the hold goes on"
    with admin(gw) as client:
        assert (
            client.post(f"http://sandgate/v1/access-requests/{pending['id']}/approve", json={}).status_code
            == 200
        )
    out, _ = curl.communicate(timeout=40)
    assert out == "200"
    assert len(http_upstream.wait_for_requests(1)) == 1
    failed = [json.loads(line) for line in gw.log().splitlines() if "approval.webhook_failed" in line]
    assert failed[0]["attempts"] == 3 and failed[0]["id"] == pending["id"]
    assert failed[0]["receiver"] == f"http://127.0.0.1:{port}/hook"
    log = gw.log()
    for secret in (SECRET, "pw-in-url", "q-secret"):
        assert secret not in log


def test_a_failing_receiver_gets_the_same_call_again(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, receiver: Receiver
) -> None:
    receiver.statuses = [503]
    receiver.decide = "deny"
    gw = start_hooked(start_gateway, http_upstream, receiver.url)
    receiver.admin_socket = gw.root / "state" / "admin.sock"
    curl = start_curl(gw, f"http://api.test:{http_upstream.port}/v1/again")
    first, second = receiver.wait_calls(2)
    out, _ = curl.communicate(timeout=40)
    assert out == "403", "denied on the second call"
    assert first.genuine and second.genuine
    assert first.delivery == second.delivery and first.body == second.body
    assert receiver.decisions == [200]
    assert http_upstream.requests == []
    assert metric(gw, 'sandgate_approval_webhook_calls_total{result="retried"}') == 1
    assert metric(gw, 'sandgate_approval_webhook_calls_total{result="delivered"}') == 1


def test_a_guests_proposal_is_announced_and_decided_by_the_receiver(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, receiver: Receiver
) -> None:
    receiver.decide = "approve"
    gw = start_hooked(start_gateway, http_upstream, receiver.url)
    receiver.admin_socket = gw.root / "state" / "admin.sock"
    endpoint = "http://sandgate.internal/v1/access-requests"
    proposal = {"host": "api.test", "port": http_upstream.port, "methods": ["POST"], "reason": "upload"}
    with httpx.Client(proxy=gw.proxy(), timeout=10) as guest:
        answer = guest.post(endpoint, json=proposal)
        assert answer.status_code == 202, answer.text
        [call] = receiver.wait_calls(1)
        assert call.genuine
        request = call.body["request"]
        assert (request["id"], request["kind"], request["state"], request["note"]) == (
            answer.json()["id"],
            "proposal",
            "pending",
            "upload",
        )
        assert receiver.decisions == [200]
        assert guest.get(answer.json()["poll"]).json()["state"] == "approved"


def test_with_two_workers_each_request_is_announced_once(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, receiver: Receiver
) -> None:
    receiver.decide = "approve"
    gw = start_gateway(
        {"t1.yaml": asking_tenant(http_upstream.port)},
        config={
            "workers": {"count": 2},
            "approvals": {"webhook": {"url": receiver.url, "secret": "env:SANDGATE_TEST_HOOK"}},
        },
        env={"SANDGATE_TEST_HOOK": SECRET},
    )
    receiver.admin_socket = gw.root / "state" / "admin.sock"
    curls = [start_curl(gw, f"http://api.test:{http_upstream.port}/w/{i}") for i in range(6)]
    assert [c.communicate(timeout=60)[0] for c in curls] == ["200"] * 6
    calls = receiver.wait_calls(6)
    time.sleep(0.5)
    assert len(receiver.calls) == 6, "one call per request"
    assert len({c.delivery for c in calls}) == 6 and all(c.genuine for c in calls)
    assert receiver.decisions == [200] * 6
    assert len(http_upstream.wait_for_requests(6)) == 6


def test_signatures_bind_the_timestamp_and_the_body() -> None:
    key, body = SECRET.encode(), b'{"a":1}'
    now = 1_800_000_000
    signature = sign(key, str(now), body)
    assert verify(key, str(now), body, signature, now=now + 10)
    assert not verify(key, str(now), body + b" ", signature, now=now)
    assert not verify(key, str(now + 1), body, signature, now=now)
    assert not verify(b"another-key-0123456789", str(now), body, signature, now=now)
    assert not verify(key, str(now), body, signature, now=now + 301), "a replay past the window"
    assert not verify(key, "soon", body, signature, now=now)


def test_an_unreadable_secret_is_refused_without_showing_it() -> None:
    os.environ["SANDGATE_TEST_SHORT_HOOK"] = "short-secret"
    try:
        with pytest.raises(ConfigError) as refused:
            load_webhook_secret("env:SANDGATE_TEST_SHORT_HOOK")
    finally:
        del os.environ["SANDGATE_TEST_SHORT_HOOK"]
    assert "approvals.webhook.secret" in str(refused.value) and "short-secret" not in str(refused.value)
    with pytest.raises(ConfigError) as literal:
        load_webhook_secret("whsec-a-literal-secret-value")
    assert "whsec-a-literal-secret-value" not in str(literal.value)
