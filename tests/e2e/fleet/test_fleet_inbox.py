"""The fleet's approval inbox end to end: two real gateways sharing one real redis-server; a
request held on gateway b (a real curl through b's explicit proxy to a loopback upstream, an
`ask` rule) is listed and decided through gateway a with `sandgate requests`, exactly as b
would decide it itself."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SANDGATE, TOKEN_REF, Gateways, RunningGateway
from support import RecordingUpstream, RedisServer, TestPKI

from sandgate.proxy.approvals.fleet_inbox import EXPIRE_AFTER

pytestmark = pytest.mark.slow


def asking_tenant(port: int) -> str:
    """Tenant t1 (sandbox sb1): anything on api.test:`port` is asked about."""
    return yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
            "ask": [{"id": "api", "hosts": ["api.test"], "ports": [port]}],
        },
        sort_keys=False,
    )


@dataclass(frozen=True)
class Fleet:
    a: RunningGateway
    b: RunningGateway
    redis: RedisServer


def start_fleet(folder: Path, pki: TestPKI, upstream: RecordingUpstream) -> tuple[Gateways, Fleet]:
    server = RedisServer(folder / "redis").start()
    gateways = Gateways(folder, pki)

    def member(name: str) -> RunningGateway:
        config = {
            "redis": {"url": server.url, "gateway_id": name},
            "approvals": {"max_held_per_sandbox": 10, "ask_timeout_seconds": 60},
            "workers": {"count": 1},
        }
        return gateways.start({"t1.yaml": asking_tenant(upstream.port)}, config=config)

    return gateways, Fleet(member("gw-a"), member("gw-b"), server)


@pytest.fixture
def fleet(tmp_path: Path, pki: TestPKI, http_upstream: RecordingUpstream) -> Iterator[Fleet]:
    gateways, started = start_fleet(tmp_path, pki, http_upstream)
    try:
        yield started
    finally:
        gateways.close()
        started.redis.stop()


def sandgate(gw: RunningGateway, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, *args, "--config", str(gw.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=30,
    )


def listing(gw: RunningGateway) -> dict[str, Any]:
    out = sandgate(gw, "requests", "list", "--format", "json")
    assert out.returncode == 0, out.stderr
    listed: dict[str, Any] = json.loads(out.stdout)
    return listed


def held_on(gw: RunningGateway, holder: str, count: int = 1, timeout: float = 15.0) -> list[dict[str, Any]]:
    """The held requests `gw` lists as held by gateway `holder`, once there are `count`."""
    deadline = time.monotonic() + timeout
    while True:
        found = [r for r in listing(gw)["requests"] if r["gateway"] == holder and r["state"] == "held"]
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"expected {count} held on {holder}, found {found}"
        time.sleep(0.1)


def start_curl(gw: RunningGateway, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["curl", "-sS", "-m", "30", "-x", gw.proxy(), "-o", "-", "-w", "\n%{http_code}", "-D", "-", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=40)
    body, _, code = out.rpartition("\n")
    return int(code), body


def test_a_request_held_on_b_is_listed_on_a_and_approved_there_once(
    fleet: Fleet, http_upstream: RecordingUpstream
) -> None:
    curl = start_curl(fleet.b, f"http://api.test:{http_upstream.port}/on-b")
    [pending] = held_on(fleet.a, "gw-b")
    assert (pending["host"], pending["path"], pending["sandbox"]) == ("api.test", "/on-b", "sb1")
    assert [r["id"] for r in listing(fleet.a)["requests"]].count(pending["id"]) == 1
    assert listing(fleet.a)["fleet"] == {"reachable": True}
    # b lists its own once, as its own.
    [own] = [r for r in listing(fleet.b)["requests"] if r["id"] == pending["id"]]
    assert own["gateway"] == "gw-b"
    table = sandgate(fleet.a, "requests", "list").stdout.splitlines()
    assert table[0].split()[-1] == "gateway"
    [row] = [line for line in table if line.startswith(pending["id"])]
    assert row.split()[-1] == "gw-b", "the table names the holder"

    approved = sandgate(fleet.a, "requests", "approve", pending["id"], "--format", "json")
    assert approved.returncode == 0, approved.stderr
    answer = json.loads(approved.stdout)
    assert (answer["state"], answer["gateway"], answer["decided_through"]) == ("approved", "gw-b", "gw-a")
    status, body = finish(curl)
    assert status == 200, body
    assert [r.target for r in http_upstream.wait_for_requests(1)] == ["/on-b"]

    # b wrote the records, as for a decision taken on b: the held one and its end, by the operator.
    records = fleet.b.records_until(lambda rs: len(rs) >= 2)
    ends = [r for r in records if (r.get("approval") or {}).get("id") == pending["id"]]
    assert [(r["decision"], r["reason"]) for r in ends] == [("allow", "allowed")]
    assert ends[0]["approval"]["by"] == answer["by"] and answer["by"]
    assert not [r for r in fleet.a.records() if r.get("approval")], "a holds nothing, records nothing"
    # Settled: gone from every listing (b publishes the change at once).
    deadline = time.monotonic() + 5
    while pending["id"] in [r["id"] for r in listing(fleet.a)["requests"]]:
        assert time.monotonic() < deadline, "still listed after it was settled"
        time.sleep(0.1)

    # A second decision from a on the settled request: 409, as on b.
    again = sandgate(fleet.a, "requests", "deny", pending["id"])
    assert again.returncode == 1 and "already approved" in again.stderr, again.stderr


def test_deny_from_a_refuses_it_on_b_with_the_note_and_an_unknown_id_is_404(
    fleet: Fleet, http_upstream: RecordingUpstream
) -> None:
    curl = start_curl(fleet.b, f"http://api.test:{http_upstream.port}/denied")
    [pending] = held_on(fleet.a, "gw-b")
    denied = sandgate(fleet.a, "requests", "deny", pending["id"], "--reason", "not today", "--format", "json")
    assert denied.returncode == 0, denied.stderr
    answer = json.loads(denied.stdout)
    assert (answer["state"], answer["reason"], answer["gateway"]) == ("denied", "not today", "gw-b")
    status, head = finish(curl)
    assert status == 403
    assert "x-sandgate-reason: approval_denied" in head.lower()
    assert http_upstream.requests == [], "a denied request never reaches the upstream"
    [end] = [r for r in fleet.b.records_until(lambda rs: len(rs) >= 2) if r.get("approval")]
    assert (end["reason"], end["approval"]["id"]) == ("approval_denied", pending["id"])

    nobody = sandgate(fleet.a, "requests", "approve", "0123456789abcdef0123")
    assert nobody.returncode == 1 and "no access request" in nobody.stderr, nobody.stderr


def test_one_request_approved_from_a_and_from_b_at_once_is_settled_once(
    fleet: Fleet, http_upstream: RecordingUpstream
) -> None:
    curl = start_curl(fleet.b, f"http://api.test:{http_upstream.port}/race")
    [pending] = held_on(fleet.a, "gw-b")
    with ThreadPoolExecutor(2) as pool:
        answers = list(
            pool.map(lambda gw: sandgate(gw, "requests", "approve", pending["id"]), [fleet.a, fleet.b])
        )
    assert sorted(a.returncode for a in answers) == [0, 1], [a.stderr for a in answers]
    assert any("already approved" in a.stderr for a in answers)
    assert finish(curl)[0] == 200
    http_upstream.wait_for_requests(1)
    time.sleep(0.5)
    assert len(http_upstream.requests) == 1, "released exactly once"
    records = fleet.b.records_until(lambda rs: len(rs) >= 2)
    assert len([r for r in records if (r.get("approval") or {}).get("id") == pending["id"]]) == 1


def test_redis_gone_a_lists_its_own_says_so_and_refuses_a_remote_approval(
    fleet: Fleet, http_upstream: RecordingUpstream
) -> None:
    on_b = start_curl(fleet.b, f"http://api.test:{http_upstream.port}/on-b")
    on_a = start_curl(fleet.a, f"http://api.test:{http_upstream.port}/on-a")
    [remote] = held_on(fleet.a, "gw-b")
    [own] = held_on(fleet.a, "gw-a")
    fleet.redis.kill()

    listed = listing(fleet.a)
    assert [r["id"] for r in listed["requests"]] == [own["id"]], "its own, still listed"
    assert listed["fleet"]["reachable"] is False
    table = sandgate(fleet.a, "requests", "list")
    assert "the fleet's redis is unreachable" in table.stdout and own["id"] in table.stdout
    refused = sandgate(fleet.a, "requests", "approve", remote["id"])
    assert refused.returncode != 0 and "redis is unreachable" in refused.stderr, refused.stderr
    # Nothing reached b: its request is still held, and its own decision still works.
    assert [r["state"] for r in listing(fleet.b)["requests"] if r["id"] == remote["id"]] == ["held"]
    assert sandgate(fleet.b, "requests", "deny", remote["id"]).returncode == 0
    assert sandgate(fleet.a, "requests", "approve", own["id"]).returncode == 0
    assert finish(on_a)[0] == 200 and finish(on_b)[0] == 403


def test_a_killed_gateways_requests_leave_the_listing_within_the_expiry(
    fleet: Fleet, http_upstream: RecordingUpstream
) -> None:
    curl = start_curl(fleet.b, f"http://api.test:{http_upstream.port}/b-dies")
    [pending] = held_on(fleet.a, "gw-b")
    fleet.b.proc.kill()  # no clean stop: its listing stays in redis until it expires
    fleet.b.proc.wait(10)
    killed = time.monotonic()
    # Still listed (until its listing expires): a decision handed to it is refused in bounded
    # time, and taken back, so nothing is applied later.
    lost = sandgate(fleet.a, "requests", "approve", pending["id"])
    assert lost.returncode == 2 and "nothing was applied" in lost.stderr, lost.stderr
    while pending["id"] in [r["id"] for r in listing(fleet.a)["requests"]]:
        assert time.monotonic() - killed < EXPIRE_AFTER + 3, "a dead gateway's request stays listed"
        time.sleep(0.2)
    gone = sandgate(fleet.a, "requests", "approve", pending["id"])
    assert gone.returncode == 1 and "no access request" in gone.stderr, gone.stderr
    curl.communicate(timeout=40)
