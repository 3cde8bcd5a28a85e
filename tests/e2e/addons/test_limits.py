"""End to end: tenants' limits enforced by real gateways, alone and as a fleet sharing redis."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis
import yaml
from conftest import GatewayFactory, RunningGateway, curl, tenant_yaml
from support import RecordingUpstream, RedisServer, TestPKI, wait_for_presence_since

pytestmark = pytest.mark.slow

# Where each gateway of a fleet marks itself alive, about once a second (sandgate.proxy.fleet.limits_sync).
PRESENCE = "sandgate:limits:gateways"


def limited_tenant(upstream: RecordingUpstream, **limits: int) -> str:
    doc = yaml.safe_load(tenant_yaml("t1", [{"id": "api", "hosts": ["api.test"], "ports": [upstream.port]}]))
    doc["limits"] = limits
    return yaml.safe_dump(doc, sort_keys=False)


def fleet_config(server: RedisServer) -> dict[str, Any]:
    return {"redis": {"url": server.url}, "limits": {"sync_interval_seconds": 0.05}}


def send(gw: RunningGateway, upstream: RecordingUpstream, count: int, **kwargs: Any) -> list[httpx.Response]:
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        return [c.post(f"{upstream.url_for('api.test')}/r{i}", **kwargs) for i in range(count)]


def assert_limited(resp: httpx.Response, gw: RunningGateway, status: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == status
    assert resp.headers["X-Sandgate-Reason"] == reason
    body = resp.json()
    assert body["reason"] == reason
    record = gw.record(str(body["decision_id"]))
    assert (record["decision"], record["reason"]) == ("deny", reason)
    return record


def fleet_total(server: RedisServer, kind: str = "requests") -> int:
    client = redis.Redis.from_url(server.url)
    try:
        return sum(int(client.get(k) or 0) for k in client.scan_iter(f"sandgate:limits:sandbox:*:{kind}:*"))
    finally:
        client.close()


def wait_for_fleet_total(server: RedisServer, expected: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while (total := fleet_total(server)) != expected:
        assert time.monotonic() < deadline, f"fleet total {total}, expected {expected}"
        time.sleep(0.02)


def test_the_request_over_requests_per_minute_gets_429_and_never_reaches_the_upstream(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway({"t1.yaml": limited_tenant(http_upstream, requests_per_minute=5)})
    responses = send(gw, http_upstream, 6)
    assert [r.status_code for r in responses[:5]] == [200] * 5
    record = assert_limited(responses[5], gw, 429, "rate_limited")
    assert record["detail"] == "requests_per_minute"
    assert int(responses[5].headers["Retry-After"]) >= 1
    assert len(http_upstream.requests) == 5


def test_report_mode_still_enforces_limits(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    doc = yaml.safe_load(limited_tenant(http_upstream, requests_per_minute=2))
    doc["mode"] = "report"
    gw = start_gateway({"t1.yaml": yaml.safe_dump(doc)})
    responses = send(gw, http_upstream, 3)
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert len(http_upstream.requests) == 2


def test_a_declared_body_over_request_body_bytes_gets_413_and_is_never_forwarded(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway({"t1.yaml": limited_tenant(http_upstream, request_body_bytes=100)})
    (small,) = send(gw, http_upstream, 1, content=b"x" * 100)
    assert small.status_code == 200
    (large,) = send(gw, http_upstream, 1, content=b"x" * 101)
    assert_limited(large, gw, 413, "body_too_large")
    assert "Retry-After" not in large.headers
    assert len(http_upstream.requests) == 1


def test_a_declared_body_mitmproxy_streams_is_refused_without_crashing_the_flow(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    """Over 1 MiB mitmproxy streams the body before the hooks run: the refusal is answered at
    once (the HTTP error seam) and recorded, and nothing goes upstream."""
    gw = start_gateway({"t1.yaml": limited_tenant(http_upstream, request_body_bytes=1 << 20)})
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        resp = c.post(f"{http_upstream.url_for('api.test')}/big", content=b"z" * (2 << 20))
    assert (resp.status_code, resp.headers["X-Sandgate-Reason"]) == (413, "body_too_large")
    records = gw.records_until(lambda rs: any(r["reason"] == "body_too_large" for r in rs))
    (rec,) = [r for r in records if r["reason"] == "body_too_large"]
    assert rec["detail"] == "request_body_bytes"
    assert http_upstream.requests == []
    assert "mitmproxy has crashed" not in gw.log()


def test_a_chunked_body_over_request_body_bytes_is_cut_and_never_completes_upstream(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway({"t1.yaml": limited_tenant(http_upstream, request_body_bytes=1000)})

    def body(size: int) -> Iterator[bytes]:
        for _ in range(size // 100):
            yield b"y" * 100

    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        ok = c.post(f"{http_upstream.url_for('api.test')}/small", content=body(1000))
        assert ok.status_code == 200
        cut = c.post(f"{http_upstream.url_for('api.test')}/large", content=body(5000))
        assert (cut.status_code, cut.headers["X-Sandgate-Reason"]) == (413, "body_too_large")
    records = gw.records_until(lambda rs: any(r["reason"] == "body_too_large" for r in rs))
    (rec,) = [r for r in records if r["reason"] == "body_too_large"]
    assert rec["detail"] == "request_body_bytes (in a streamed body)"
    (forwarded,) = http_upstream.requests
    assert (forwarded.target, len(forwarded.body)) == ("/small", 1000)


def test_egress_bytes_over_the_hour_cap_are_refused(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway({"t1.yaml": limited_tenant(http_upstream, egress_bytes_per_hour=2500)})
    responses = send(gw, http_upstream, 3, content=b"z" * 1000)
    assert [r.status_code for r in responses[:2]] == [200, 200]
    record = assert_limited(responses[2], gw, 429, "rate_limited")
    assert record["detail"] == "egress_bytes_per_hour"
    assert len(http_upstream.requests) == 2


def test_a_fleet_shares_requests_per_minute_through_redis(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, redis_server: RedisServer
) -> None:
    tenant = {"t1.yaml": limited_tenant(http_upstream, requests_per_minute=10)}
    a = start_gateway(tenant, config=fleet_config(redis_server))
    b = start_gateway(tenant, config=fleet_config(redis_server))
    through_a = send(a, http_upstream, 6)
    assert [r.status_code for r in through_a] == [200] * 6
    wait_for_fleet_total(redis_server, 6)
    # At once, from six connections: the requests b sees while its first sync for the sandbox
    # runs wait for it too, so none is admitted on b's local count alone.
    with ThreadPoolExecutor(6) as pool:
        through_b = [r for rs in pool.map(lambda _: send(b, http_upstream, 1), range(6)) for r in rs]
    admitted = sum(r.status_code == 200 for r in through_a + through_b)
    # b syncs once before its first decision on the sandbox, so it knows a's 6; a is idle meanwhile
    # (the documented overshoot, what other gateways admit between syncs, is none here).
    assert admitted == 10
    assert all(r.status_code in (200, 429) for r in through_b)
    assert len(http_upstream.requests) == admitted


def test_when_redis_dies_each_gateway_admits_only_its_share_of_what_remains(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, redis_server: RedisServer
) -> None:
    tenant = {"t1.yaml": limited_tenant(http_upstream, requests_per_minute=10)}
    config = fleet_config(redis_server)
    a = start_gateway(tenant, config={**config, "redis": {**config["redis"], "gateway_id": "gw-a"}})
    b = start_gateway(tenant, config={**config, "redis": {**config["redis"], "gateway_id": "gw-b"}})
    client = redis.Redis.from_url(redis_server.url)
    deadline = time.monotonic() + 10
    while client.zcard(PRESENCE) < 2:
        assert time.monotonic() < deadline, "the gateways did not mark themselves alive"
        time.sleep(0.05)
    client.close()
    # One more presence round: each has counted both.
    wait_for_presence_since(redis_server.url, PRESENCE, ["gw-a", "gw-b"], time.time())
    assert [r.status_code for r in send(a, http_upstream, 4)] == [200] * 4
    wait_for_fleet_total(redis_server, 4)
    assert [r.status_code for r in send(b, http_upstream, 1)] == [200]
    wait_for_fleet_total(redis_server, 5)  # b's push came back with a's 4
    # a's next refresh learns b's 1: both know 5 of 10 are used.
    wait_for_presence_since(redis_server.url, PRESENCE, ["gw-a"], time.time())
    redis_server.kill()
    for gw in (a, b):
        deadline = time.monotonic() + 5
        while "limits.fleet_sync_failed" not in gw.log():
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.05)
    # 5 remain for 2 gateways: each admits 2 (its share, rounded down), not all 5.
    through_b = [r.status_code for r in send(b, http_upstream, 6)]
    through_a = [r.status_code for r in send(a, http_upstream, 6)]
    assert through_b == [200] * 2 + [429] * 4
    assert through_a == [200] * 2 + [429] * 4
    assert len(http_upstream.requests) == 5 + 4 <= 10


def test_a_passthrough_tunnel_counts_as_one_request_and_is_refused_over_the_limit(
    start_gateway: GatewayFactory, https_upstream: RecordingUpstream, pki: TestPKI
) -> None:
    doc = yaml.safe_load(
        tenant_yaml("t1", [{"id": "pass", "hosts": ["pass.test"], "ports": [https_upstream.port]}])
    )
    doc["limits"] = {"requests_per_minute": 2}
    gw = start_gateway({"t1.yaml": yaml.safe_dump(doc)})
    url = f"{https_upstream.url_for('pass.test')}/tunnel"
    results = [curl("--proxy", gw.proxy(), "--cacert", str(pki.ca_file), url) for _ in range(3)]
    assert [r.returncode for r in results[:2]] == [0, 0]
    assert results[2].returncode != 0
    # Until the refusal's record is there: a count of records can be reached without it (the
    # refused tunnel's CONNECT is recorded first).
    records = gw.records_until(lambda rs: any(r["reason"] == "rate_limited" for r in rs))
    (rec,) = [r for r in records if r["reason"] == "rate_limited"]
    assert (rec["phase"], rec["decision"], rec["dest"]["host"]) == ("connect", "deny", "pass.test")
    assert len(https_upstream.requests) == 2
