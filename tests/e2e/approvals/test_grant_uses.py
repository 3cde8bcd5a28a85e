"""Counted grants end to end (`sandgate requests approve --uses N [--until TIME]`) against real
gateways, a real upstream on loopback and a real redis-server: a grant of N uses lets exactly N
requests through, then the next is held again; two workers (or two gateways over redis) racing
for the last use let exactly N through together; the exhaustion is recorded once; a count that
survives a restart; redis down, a counted grant allows nothing (an uncounted one as ever)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from conftest import OTHER_TOKEN, OTHER_TOKEN_REF, SANDGATE, TOKEN_REF, GatewayFactory, RunningGateway
from support import RecordingUpstream, RedisServer, wait_for_port

pytestmark = pytest.mark.slow


def tenant(port: int) -> str:
    """Tenant t1 (sandboxes sb1, sb2): anything on api.test:`port` is asked about."""
    return yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}, {"id": "sb2", "token": OTHER_TOKEN_REF}],
            "ask": [{"id": "api", "hosts": ["api.test"], "ports": [port]}],
        },
        sort_keys=False,
    )


def sandgate(gw: RunningGateway, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, *args, "--config", str(gw.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )


def admin(gw: RunningGateway, method: str, path: str, ok: tuple[int, ...] = (200,)) -> Any:
    transport = httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock"))
    with httpx.Client(transport=transport, base_url="http://sandgate", timeout=10) as c:
        answer = c.request(method, path, json={} if method == "POST" else None)
    assert answer.status_code in ok, answer.text
    return answer.json()


def start_curl(gw: RunningGateway, url: str, sandbox: str = "sb1") -> subprocess.Popen[str]:
    proxy = gw.proxy(sandbox) if sandbox == "sb1" else gw.proxy(sandbox, OTHER_TOKEN)
    return subprocess.Popen(
        ["curl", "-sS", "-m", "30", "-x", proxy, "-o", "/dev/null", "-w", "%{http_code}", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def held(gw: RunningGateway, timeout: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        found = [r for r in admin(gw, "GET", "/v1/access-requests")["requests"] if r["state"] == "held"]
        if found:
            return dict(found[0])
        assert time.monotonic() < deadline, "no request was held"
        time.sleep(0.05)


def ask_and_approve(gw: RunningGateway, url: str, *approve: str) -> dict[str, Any]:
    """Send a request that is held, approve it with these options; the decision."""
    curl = start_curl(gw, url)
    out = sandgate(gw, "requests", "approve", held(gw)["id"], *approve, "--format", "json")
    assert out.returncode == 0, out.stderr
    assert curl.communicate(timeout=40)[0] == "200"
    return dict(json.loads(out.stdout))


def statuses(gws: list[RunningGateway], url: str, count: int, sandbox: str = "sb1") -> list[int]:
    """Send `count` requests at once (spread over `gws`); each held one is denied (403): the
    statuses, 200 for those let through at once."""
    curls = [start_curl(gws[i % len(gws)], url, sandbox) for i in range(count)]
    deadline = time.monotonic() + 30
    while any(c.poll() is None for c in curls) and time.monotonic() < deadline:
        for gw in gws:
            for r in admin(gw, "GET", "/v1/access-requests")["requests"]:
                if r["state"] == "held":
                    admin(gw, "POST", f"/v1/access-requests/{r['id']}/deny", ok=(200, 409))
        time.sleep(0.05)
    return [int(c.communicate(timeout=40)[0] or 0) for c in curls]


def exhausted(gw: RunningGateway, gid: str) -> list[dict[str, Any]]:
    """The `exhausted` records of the grant, once the trail is quiet."""
    return [
        r for r in gw.settled(event="grant") if r.get("action") == "exhausted" and r.get("approval_id") == gid
    ]


def listed(gw: RunningGateway, gid: str) -> dict[str, Any]:
    out = sandgate(gw, "requests", "grants", "--format", "json")
    assert out.returncode == 0, out.stderr
    [found] = [g for g in json.loads(out.stdout)["grants"] if g["id"] == gid]
    return dict(found)


def restart(gw: RunningGateway) -> RunningGateway:
    """The same gateway (folder, config, port) started again after it stopped (one worker)."""
    gw.stop()
    (gw.root / "state" / "gateway.json").unlink(missing_ok=True)
    log_path = gw.root / "gateway-restarted.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [SANDGATE, "run", "--config", str(gw.root / "sandgate.yaml")],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=gw.root,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    again = RunningGateway(port=gw.port, root=gw.root, proc=proc, log_path=log_path)
    wait_for_port("127.0.0.1", gw.port, timeout=60)
    return again


@pytest.fixture
def own() -> Iterator[list[RunningGateway]]:
    started: list[RunningGateway] = []
    yield started
    for gw in started:
        gw.stop()


def test_a_grant_of_two_uses_lets_two_requests_through_then_holds_the_third(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway({"t1.yaml": tenant(http_upstream.port)}, config={"workers": {"count": 1}})
    url = f"http://api.test:{http_upstream.port}/v1/items"
    decided = ask_and_approve(gw, url, "--scope", "sandbox", "--uses", "2", "--until", "2099-01-01T00:00:00Z")
    gid, grant = decided["id"], decided["grant"]
    assert grant["max_uses"] == 2
    gw.mark()
    assert listed(gw, gid)["uses"] == 0
    assert statuses([gw], url, 1) == [200]
    assert statuses([gw], url, 1) == [200]
    assert statuses([gw], url, 1) == [403], "used up: held again (and denied here)"
    row = listed(gw, gid)
    assert (row["uses"], row["uses_left"], row["exhausted"], row["max_uses"]) == (2, 0, True, 2)
    text = sandgate(gw, "requests", "grants").stdout
    assert "2/2 (exhausted)" in text and row["expires"] in text
    [record] = exhausted(gw, gid)
    assert (record["uses"], record["max_uses"], record["sandbox"]) == (2, 2, "sb1")
    allowed = [r for r in gw.records(event="decision") if r.get("rule_id") == f"t1/grant/{gid}"]
    assert len(allowed) == 2


def test_approve_refuses_uses_that_make_no_sense(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway({"t1.yaml": tenant(http_upstream.port)}, config={"workers": {"count": 1}})
    curl = start_curl(gw, f"http://api.test:{http_upstream.port}/v1/nonsense")
    rid = held(gw)["id"]
    for args in (["--uses", "0", "--scope", "sandbox"], ["--uses", "2"], ["--until", "tomorrow"]):
        out = sandgate(gw, "requests", "approve", rid, *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
    out = sandgate(gw, "requests", "approve", rid, "--scope", "sandbox", "--until", "2000-01-01T00:00:00Z")
    assert out.returncode == 2 and "past" in out.stderr
    out = sandgate(
        gw, "requests", "approve", rid, "--scope", "sandbox", "--ttl", "1h", "--until", "2099-01-01T00:00Z"
    )
    assert out.returncode == 2 and "not both" in out.stderr
    assert sandgate(gw, "requests", "deny", rid).returncode == 0
    curl.communicate(timeout=40)


def test_two_workers_racing_for_the_last_uses_let_exactly_max_uses_through(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway({"t1.yaml": tenant(http_upstream.port)}, config={"workers": {"count": 2}})
    url = f"http://api.test:{http_upstream.port}/v1/race"
    gid = ask_and_approve(gw, url, "--scope", "sandbox", "--uses", "3")["id"]
    gw.mark()
    results = statuses([gw], url, 12)
    assert sorted(results) == [200] * 3 + [403] * 9
    assert len(exhausted(gw, gid)) == 1
    assert (gw.root / "state" / "grant-uses" / gid).read_text() == "3"


def test_a_tenant_grants_file_grants_count_survives_a_restart(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, own: list[RunningGateway]
) -> None:
    gw = start_gateway({"t1.yaml": tenant(http_upstream.port)}, config={"workers": {"count": 1}})
    url = f"http://api.test:{http_upstream.port}/v1/team"
    gid = ask_and_approve(gw, url, "--scope", "tenant", "--uses", "2")["id"]
    assert "max_uses: 2" in (gw.rules_dir / "tenants" / "t1.grants.yaml").read_text()
    assert statuses([gw], url, 1, sandbox="sb2") == [200]
    again = restart(gw)
    own.append(again)
    # Sent at once: which of the two takes the last use is a race, that one of them does is not.
    assert sorted(statuses([again], url, 2)) == [200, 403], "one use left after the restart, not two"
    assert listed(again, gid)["uses"] == 2


def test_over_redis_two_gateways_share_the_count_and_redis_down_the_grant_allows_nothing(
    start_gateway: GatewayFactory,
    http_upstream: RecordingUpstream,
    redis_server: RedisServer,
) -> None:
    config = {"redis": {"url": redis_server.url}, "workers": {"count": 1}}
    a = start_gateway({"t1.yaml": tenant(http_upstream.port)}, config=config)
    b = start_gateway({"t1.yaml": tenant(http_upstream.port)}, config=config)
    url = f"http://api.test:{http_upstream.port}/v1/fleet"
    gid = ask_and_approve(a, url, "--scope", "tenant", "--uses", "4")["id"]
    deadline = time.monotonic() + 10
    while not any(g["id"] == gid for g in admin(b, "GET", "/v1/grants")["grants"]):
        assert time.monotonic() < deadline, "the grant did not reach the other gateway"
        time.sleep(0.1)
    a.mark()
    b.mark()
    assert sorted(statuses([a, b], url, 10)) == [200] * 4 + [403] * 6
    assert len(exhausted(a, gid)) + len(exhausted(b, gid)) == 1

    counted = f"http://api.test:{http_upstream.port}/v1/counted"
    plain = f"http://api.test:{http_upstream.port}/v1/plain"
    ask_and_approve(a, counted, "--scope", "sandbox", "--uses", "5")
    ask_and_approve(a, plain, "--scope", "sandbox")
    redis_server.kill()
    assert statuses([a], counted, 1) == [403], "the count is out of reach: no use, asked again"
    assert statuses([a], plain, 1) == [200], "an uncounted grant is as ever (its snapshot is kept)"
