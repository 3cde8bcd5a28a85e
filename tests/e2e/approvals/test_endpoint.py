"""The guests' endpoint at the reserved name, through a real gateway's explicit proxy: propose,
poll, approve and deny through the admin API, another sandbox kept out, the rate limit, refusals
at once, and the name never resolved or forwarded, even where a rule names it."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import SANDGATE, TEST_HOSTS, UPSTREAM_IP, GatewayFactory, RunningGateway
from support import RecordingUpstream

pytestmark = pytest.mark.slow

NAME = "sandgate.internal"
ENDPOINT = f"http://{NAME}/v1/access-requests"
SANDBOXES = ("sb1", "sb2", "sb3", "sb4", "sb5", "sb6", "sb7", "sb8")
PER_MINUTE = 4


def token(sandbox: str) -> str:
    return f"{sandbox}-token-0123456789abcdef"


def tenant(port: int) -> str:
    """Tenant t1: GET /open on api.test allowed, POST on api.test:`port` asked about,
    blocked.test denied, and a rule naming the reserved name itself (it must not matter)."""
    return yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [
                {"id": s, "token": "sha256:" + hashlib.sha256(token(s).encode()).hexdigest()}
                for s in SANDBOXES
            ],
            "allow": [
                {
                    "id": "open",
                    "hosts": ["api.test"],
                    "ports": [port],
                    "methods": ["GET"],
                    "paths": ["/open"],
                },
                {"id": "self", "hosts": [NAME], "ports": [80, 443, port]},
            ],
            "ask": [{"id": "writes", "hosts": ["api.test"], "ports": [port], "methods": ["POST"]}],
            "deny": [{"id": "blocked", "hosts": ["blocked.test"]}],
        },
        sort_keys=False,
    )


@pytest.fixture(scope="module")
def shared(start_module_gateway: GatewayFactory, http_upstream: RecordingUpstream) -> RunningGateway:
    return start_module_gateway(
        {"t1.yaml": tenant(http_upstream.port)},
        config={
            # The reserved name resolves to the counting upstream: were it ever dialled, it would show.
            "resolver": {"hosts": {**TEST_HOSTS, NAME: [UPSTREAM_IP], "blocked.test": [UPSTREAM_IP]}},
            "approvals": {"proposals_per_minute": PER_MINUTE, "max_held_per_sandbox": 10},
            # One worker: each worker keeps its own proposals.
            "workers": {"count": 1},
        },
    )


@pytest.fixture
def gw(shared: RunningGateway, http_upstream: RecordingUpstream) -> RunningGateway:
    shared.mark()
    http_upstream.reset()
    return shared


@pytest.fixture
def guest(gw: RunningGateway) -> Iterator[Any]:
    """An httpx client per sandbox, through the proxy with that sandbox's credential."""
    clients: dict[str, httpx.Client] = {}

    def client(sandbox: str) -> httpx.Client:
        if sandbox not in clients:
            clients[sandbox] = httpx.Client(proxy=gw.proxy(sandbox, token(sandbox)), timeout=10)
        return clients[sandbox]

    yield client
    for c in clients.values():
        c.close()


def admin(gw: RunningGateway, method: str, path: str, **kwargs: Any) -> httpx.Response:
    transport = httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock"))
    with httpx.Client(transport=transport, base_url="http://sandgate", timeout=10) as c:
        return c.request(method, path, **kwargs)


def proposal(port: int, **extra: Any) -> dict[str, Any]:
    return {"host": "api.test", "port": port, "methods": ["POST"], "paths": ["/v1/items/*"], **extra}


def test_propose_poll_and_approve_through_the_admin_api(
    gw: RunningGateway, guest: Any, http_upstream: RecordingUpstream
) -> None:
    answer = guest("sb1").post(ENDPOINT, json=proposal(http_upstream.port, reason="upload\x1b[2J the build"))
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["state"] == "pending" and body["poll"] == f"{ENDPOINT}/{body['id']}"
    polled = guest("sb1").get(body["poll"])
    assert polled.status_code == 200 and polled.json()["state"] == "pending"
    assert polled.json()["paths"] == ["/v1/items/*"] and polled.json()["methods"] == ["POST"]

    listed = admin(gw, "GET", "/v1/access-requests").json()["requests"]
    [mine] = [r for r in listed if r["id"] == body["id"]]
    assert (mine["kind"], mine["sandbox"], mine["host"], mine["port"]) == (
        "proposal",
        "sb1",
        "api.test",
        http_upstream.port,
    )
    assert mine["note"] == "upload[2J the build", "control characters are removed from the guest's text"

    approved = admin(gw, "POST", f"/v1/access-requests/{body['id']}/approve", json={"by": "alice"})
    assert approved.status_code == 200, approved.text
    after = guest("sb1").get(body["poll"]).json()
    assert after["state"] == "approved" and after["decided"]
    assert "by" not in after, "the guest does not see who decided"

    ask, end = ask_and_end(gw, body["id"])
    assert (ask["decision"], ask["reason"], ask["sandbox"]) == ("ask", "approval_required", "sb1")
    assert ask["dest"]["host"] == "api.test" and ask["dest"]["port"] == http_upstream.port
    assert ask["proposal"] == {"methods": ["POST"], "paths": ["/v1/items/*"]}
    # Its end, as a held request's: the outcome, who decided, how long it waited.
    assert (end["decision"], end["reason"], end["sandbox"], end["tenant"]) == (
        "allow",
        "allowed",
        "sb1",
        "t1",
    )
    assert (end["approval"]["by"], end["proposal"], end["dest"]) == ("alice", ask["proposal"], ask["dest"])
    assert 0 <= end["approval"]["waited_seconds"] < 10
    assert end["decision_id"] != ask["decision_id"]
    assert http_upstream.requests == []


def ask_and_end(gw: RunningGateway, approval_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A proposal's two decision records: its `ask` and its end (once both are written)."""

    def chain(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rs if approval_id in (r.get("approval_id"), (r.get("approval") or {}).get("id"))]

    records = chain(gw.records_until(lambda rs: len(chain(rs)) >= 2))
    (ask,) = [r for r in records if r.get("approval_id") == approval_id]
    (end,) = [r for r in records if r is not ask]
    return ask, end


def test_a_denied_proposal_polls_denied_and_another_sandbox_cannot_read_it(
    gw: RunningGateway, guest: Any, http_upstream: RecordingUpstream
) -> None:
    body = guest("sb2").post(ENDPOINT, json=proposal(http_upstream.port)).json()
    assert guest("sb3").get(body["poll"]).status_code == 404, "another sandbox: not there"
    assert guest("sb3").get(f"{ENDPOINT}/not-an-id").status_code == 404
    listed = subprocess.run(
        [SANDGATE, "requests", "list", "--config", str(gw.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    # What the operator reads is what the guest asked for, not a CONNECT it never sent.
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["id", "state", "created", "tenant/sandbox", "request"]
    (line,) = [x for x in rows if x.startswith(body["id"])]
    assert re.search(rf"  t1/sb2 +proposal: POST api\.test:{http_upstream.port} /v1/items/\*$", line), line
    denied = subprocess.run(
        [SANDGATE, "requests", "deny", body["id"], "--config", str(gw.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert denied.returncode == 0, denied.stderr
    assert guest("sb2").get(body["poll"]).json()["state"] == "denied"
    assert guest("sb3").get(body["poll"]).status_code == 404
    _, end = ask_and_end(gw, body["id"])
    assert (end["decision"], end["reason"], end["sandbox"]) == ("deny", "approval_denied", "sb2")
    assert end["detail"] == "an operator denied this proposal"


def test_proposals_are_validated_with_the_field_named(
    gw: RunningGateway, guest: Any, http_upstream: RecordingUpstream
) -> None:
    port = http_upstream.port
    cases: list[tuple[dict[str, Any], str]] = [
        ({"port": port}, "host"),
        ({**proposal(port), "host": "bad host!"}, "host"),
        ({**proposal(port), "host": "*.api.test"}, "host"),
        ({**proposal(port), "port": 70000}, "port"),
        ({**proposal(port), "port": "443"}, "port"),
        ({**proposal(port), "methods": ["BREW"]}, "methods"),
        ({**proposal(port), "methods": []}, "methods"),
        ({**proposal(port), "paths": ["v1"]}, "paths"),
        ({**proposal(port), "paths": ["/a//b"]}, "paths"),
        ({**proposal(port), "paths": ["/a/../b"]}, "paths"),
        ({**proposal(port), "reason": 5}, "reason"),
        ({**proposal(port), "sandbox": "sb1"}, "sandbox"),
    ]
    for sent, field in cases:
        answer = guest("sb4").post(ENDPOINT, json=sent)
        assert answer.status_code == 400 and answer.json()["field"] == field, (sent, answer.text)
    assert guest("sb4").post(ENDPOINT, content=b"[1]").json()["field"] == "body"
    too_big = guest("sb4").post(ENDPOINT, json={**proposal(port), "reason": "x" * 20_000})
    assert too_big.status_code == 413
    listed = admin(gw, "GET", "/v1/access-requests").json()["requests"]
    assert [r for r in listed if r["sandbox"] == "sb4"] == [], "nothing invalid was opened"
    # Invalid proposals are not counted against the rate limit, nor recorded.
    assert guest("sb4").post(ENDPOINT, json=proposal(port)).status_code == 202
    assert not [r for r in gw.settled() if r["sandbox"] == "sb4" and r["decision"] != "ask"]


def test_the_rate_limit_answers_429_with_retry_after(
    gw: RunningGateway, guest: Any, http_upstream: RecordingUpstream
) -> None:
    answers = [guest("sb5").post(ENDPOINT, json=proposal(http_upstream.port)) for _ in range(PER_MINUTE)]
    assert [a.status_code for a in answers] == [202] * PER_MINUTE
    limited = guest("sb5").post(ENDPOINT, json=proposal(http_upstream.port))
    assert limited.status_code == 429
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert limited.json()["reason"] == "rate_limited"
    listed = admin(gw, "GET", "/v1/access-requests").json()["requests"]
    assert len([r for r in listed if r["sandbox"] == "sb5"]) == PER_MINUTE
    # Polling is not limited, and another sandbox has its own window.
    assert all(guest("sb5").get(a.json()["poll"]).status_code == 200 for a in answers)
    assert guest("sb6").post(ENDPOINT, json=proposal(http_upstream.port)).status_code == 202
    records = gw.records_until(lambda rs: any(r["reason"] == "rate_limited" for r in rs))
    [record] = [r for r in records if r["reason"] == "rate_limited"]
    assert (record["decision"], record["sandbox"], record["dest"]["host"]) == ("deny", "sb5", "api.test")


def test_what_the_guard_or_a_deny_rule_refuses_is_never_asked_about(
    gw: RunningGateway, guest: Any, http_upstream: RecordingUpstream
) -> None:
    port = http_upstream.port
    cases = [
        ({"host": "blocked.test", "port": port}, "host_denied"),
        ({"host": "169.254.169.254", "port": 80}, "private_address"),
        ({"host": NAME, "port": 80}, "reserved_host"),
    ]
    for sent, reason in cases:
        answer = guest("sb7").post(ENDPOINT, json=sent)
        assert answer.status_code == 403 and answer.json()["reason"] == reason, (sent, answer.text)
        assert "ask" not in answer.json()
    allowed = guest("sb7").post(
        ENDPOINT, json={"host": "api.test", "port": port, "methods": ["GET"], "paths": ["/open"]}
    )
    assert allowed.status_code == 200 and allowed.json()["state"] == "allowed"
    opened = [r for r in admin(gw, "GET", "/v1/access-requests").json()["requests"] if r["sandbox"] == "sb7"]
    assert all(r["host"] == "api.test" and r["methods"] != ["GET"] for r in opened)
    records = gw.records_until(
        lambda rs: sum(r["reason"] in {"host_denied", "private_address"} for r in rs) >= 2
    )
    assert {r["reason"] for r in records} >= {"host_denied", "private_address", "reserved_host"}


def test_the_reserved_name_is_never_resolved_or_forwarded(
    gw: RunningGateway, http_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    proxy = gw.proxy("sb1", token("sb1"))
    port = http_upstream.port

    def curl(*args: str) -> tuple[int, str]:
        """(the status of the answer, or of the CONNECT when it failed; the body)."""
        out = subprocess.run(
            [
                "curl",
                "-sS",
                "-m",
                "10",
                "-x",
                proxy,
                "-o",
                "-",
                "-w",
                "\n%{http_code} %{http_connect}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        body, _, codes = out.stdout.rpartition("\n")
        code, connect = (int(c) for c in codes.split())
        return code or connect, body

    # Another port on the name, though a rule names it and the resolver knows it: refused.
    status, body = curl(f"http://{NAME}:{port}/anything")
    assert status == 403 and json.loads(body)["reason"] == "reserved_host"
    # A CONNECT (curl tunnels https, or -p for http) to it: refused with its own reason.
    for args in ([f"https://{NAME}/"], ["-p", f"http://{NAME}:{port}/"], ["-p", f"http://{NAME}/"]):
        status, _ = curl(*args)
        assert status == 403, args
    # Any path on port 80 is the gateway's own answer, never the upstream's.
    status, body = curl(f"http://{NAME}/")
    assert status == 200 and json.loads(body) == {"access_requests": ENDPOINT}
    assert curl(f"http://{NAME}/v1/other")[0] == 404
    records = gw.records_until(lambda rs: sum(r["reason"] == "reserved_host" for r in rs) >= 4)
    connects = [r for r in records if r["reason"] == "reserved_host" and r["phase"] == "connect"]
    assert len(connects) == 3 and all(r["decision"] == "deny" for r in connects)
    assert http_upstream.requests == [] and http_upstream.connections == []


def test_a_denial_names_the_endpoint_and_a_proposal_that_is_accepted_as_is(
    gw: RunningGateway, guest: Any, http_upstream: RecordingUpstream
) -> None:
    port = http_upstream.port
    denied = guest("sb3").get(f"http://api.test:{port}/v1/reports?token=s3cret-value")
    assert denied.status_code == 403 and denied.json()["reason"] == "path_not_allowed"
    ask = denied.json()["ask"]
    assert ask == {
        "endpoint": ENDPOINT,
        "proposal": {"host": "api.test", "port": port, "methods": ["GET"], "paths": ["/v1/reports"]},
    }
    assert "s3cret" not in denied.text, "the query is never echoed"
    accepted = guest("sb3").post(ask["endpoint"], json=ask["proposal"])
    assert accepted.status_code == 202, accepted.text
    # A held request an operator denied names it too.
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(guest("sb3").post, f"http://api.test:{port}/v1/items", content=b"{}")
        deadline = time.monotonic() + 10
        while not (
            waiting := [
                r for r in admin(gw, "GET", "/v1/access-requests").json()["requests"] if r["kind"] == "held"
            ]
        ):
            assert time.monotonic() < deadline, "the POST was not held"
            time.sleep(0.05)
        assert admin(gw, "POST", f"/v1/access-requests/{waiting[0]['id']}/deny", json={}).status_code == 200
        denied_held = held.result(timeout=10)
    assert denied_held.status_code == 403 and denied_held.json()["reason"] == "approval_denied"
    assert denied_held.json()["ask"]["proposal"] == {
        "host": "api.test",
        "port": port,
        "methods": ["POST"],
        "paths": ["/v1/items"],
    }
    # A deny rule's refusal does not: no approval changes it.
    refused = guest("sb3").get(f"http://blocked.test:{port}/")
    assert refused.status_code == 403 and refused.json()["reason"] == "host_denied"
    assert "ask" not in refused.json()
    assert http_upstream.requests == []


def test_from_denial_to_proposal_to_approval_the_request_then_goes_out(
    gw: RunningGateway, guest: Any, http_upstream: RecordingUpstream
) -> None:
    url = f"http://api.test:{http_upstream.port}/v1/exports"
    denied = guest("sb8").get(url)
    assert denied.status_code == 403 and denied.json()["reason"] == "path_not_allowed"
    ask = denied.json()["ask"]
    created = guest("sb8").post(ask["endpoint"], json={**ask["proposal"], "reason": "nightly export"})
    assert created.status_code == 202, created.text
    approved = admin(gw, "POST", f"/v1/access-requests/{created.json()['id']}/approve", json={"by": "alice"})
    assert approved.status_code == 200, approved.text
    assert guest("sb8").get(created.json()["poll"]).json()["state"] == "approved"
    # The proposal approved (a proposal's default scope: this sandbox) lets the request out.
    allowed = guest("sb8").get(url)
    assert allowed.status_code == 200, allowed.text
    assert [r.target for r in http_upstream.wait_for_requests(1)] == ["/v1/exports"]
    # Only what was proposed: another path is still refused, with its own proposal.
    other = guest("sb8").get(f"http://api.test:{http_upstream.port}/v1/other")
    assert other.status_code == 403 and other.json()["ask"]["proposal"]["paths"] == ["/v1/other"]
    assert guest("sb1").get(url).status_code == 403, "another sandbox is not covered"


def test_with_two_workers_a_poll_finds_the_request_whichever_worker_answers(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway(
        {"t1.yaml": tenant(http_upstream.port)},
        config={
            "workers": {"count": 2},
            "approvals": {"max_held_per_sandbox": 50, "proposals_per_minute": 50},
        },
    )

    def fresh(sandbox: str) -> httpx.Client:
        # A connection per request: the explicit listener spreads them over both workers.
        return httpx.Client(
            proxy=gw.proxy(sandbox, token(sandbox)),
            timeout=10,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    with fresh("sb1") as sb1, fresh("sb2") as sb2:
        made = [sb1.post(ENDPOINT, json=proposal(http_upstream.port)) for _ in range(12)]
        assert [m.status_code for m in made] == [202] * 12
        ids = [m.json()["id"] for m in made]
        listed = {r["id"]: r for r in admin(gw, "GET", "/v1/access-requests").json()["requests"]}
        assert {listed[i]["worker"] for i in ids} == {0, 1}, "both workers hold some"
        assert admin(gw, "POST", f"/v1/access-requests/{ids[0]}/approve", json={}).status_code == 200
        for request_id in ids:
            for _ in range(3):
                polled = sb1.get(f"{ENDPOINT}/{request_id}")
                assert polled.status_code == 200, polled.text
                assert polled.json()["state"] == ("approved" if request_id == ids[0] else "pending")
                assert polled.json()["id"] == request_id and "worker" not in polled.json()
                assert sb2.get(f"{ENDPOINT}/{request_id}").status_code == 404, "another sandbox: not there"
        assert sb1.get(f"{ENDPOINT}/{'0' * 28}").status_code == 404


def test_a_proposal_nobody_decides_is_recorded_expired_when_its_time_is_up(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    """Nobody polls, lists or proposes after it: the sweep alone ends it, and its record says
    it waited exactly its timeout."""
    gw = start_gateway(
        {"t1.yaml": tenant(http_upstream.port)},
        config={"approvals": {"ask_timeout_seconds": 1.0}, "workers": {"count": 1}},
    )
    with httpx.Client(proxy=gw.proxy("sb1", token("sb1")), timeout=10) as sb1:
        made = sb1.post(ENDPOINT, json=proposal(http_upstream.port))
    assert made.status_code == 202, made.text
    proposed = time.monotonic()
    ask, end = ask_and_end(gw, made.json()["id"])
    assert time.monotonic() - proposed < 4, "recorded by the sweep, not at the store's next use"
    assert (end["decision"], end["reason"], end["detail"]) == (
        "deny",
        "approval_timeout",
        "no decision in time",
    )
    assert end["approval"]["by"] is None and end["approval"]["waited_seconds"] == pytest.approx(1.0, abs=0.01)
    assert (end["sandbox"], end["dest"], end["proposal"]) == ("sb1", ask["dest"], ask["proposal"])
    stats = subprocess.run(
        [SANDGATE, "audit", "stats", "--format", "json", "--config", str(gw.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert stats.returncode == 0, stats.stderr
    # `audit stats` counts the proposal's outcome as it counts a held request's.
    (entry,) = [a for a in json.loads(stats.stdout)["approvals"] if a["sandbox"] == "sb1"]
    assert (entry["asks"], entry["outcomes"]) == (1, {"expired": 1}), entry
