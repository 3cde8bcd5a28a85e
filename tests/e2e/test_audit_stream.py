"""A real gateway with `redis:` writes every decision to the fleet stream, through a redis outage."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import redis
from conftest import GatewayFactory, RunningGateway, tenant_yaml
from support import RecordingUpstream, RedisServer


def stream_records(server: RedisServer, gateway: str = "gw-test") -> list[dict[str, Any]]:
    """The decision records in the fleet stream from one gateway, in stream order (a fleet
    gateway's start also streams a policy_reload record: its first registry sync)."""
    entries = server.stream("sandgate:audit")
    records = [json.loads(f[b"r"]) for f in entries if f[b"gw"] == gateway.encode()]
    return [r for r in records if r["event"] == "decision"]


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def start(start_gateway: GatewayFactory, upstream: RecordingUpstream, server: RedisServer) -> RunningGateway:
    rules = [{"id": "api", "hosts": ["api.test"], "ports": [upstream.port]}]
    return start_gateway(
        {"t1.yaml": tenant_yaml("t1", rules)},
        config={
            "redis": {"url": server.url, "timeout_seconds": 0.3},
            "audit": {"gateway_name": "gw-test"},
        },
    )


def send(gw: RunningGateway, upstream: RecordingUpstream, n: int) -> list[int]:
    """n requests, allowed (api.test) and denied (other.test) in turn; their statuses."""
    statuses = []
    with httpx.Client(proxy=gw.proxy(), timeout=10) as client:
        for i in range(n):
            host = "api.test" if i % 2 == 0 else "other.test"
            statuses.append(client.get(f"http://{host}:{upstream.port}/r/{i}").status_code)
    return statuses


def test_every_decision_reaches_the_stream_with_all_its_fields(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, redis_server: RedisServer
) -> None:
    gw = start(start_gateway, http_upstream, redis_server)
    assert send(gw, http_upstream, 6) == [200, 403] * 3
    in_file = gw.records(6)
    wait_for(lambda: len(stream_records(redis_server)) >= 6)
    # The file's chain link (`prev`) is the file's own: the stream carries the records as decided.
    assert all(len(r.pop("prev")) == 64 for r in in_file)
    assert stream_records(redis_server) == in_file
    denied = [r for r in in_file if r["decision"] == "deny"]
    assert len(denied) == 3 and {r["reason"] for r in denied} == {"host_not_allowed"}
    assert {r["dest"]["host"] for r in denied} == {"other.test"}
    assert all(r["tenant"] == "t1" and r["sandbox"] == "sb1" and r["decision_id"] for r in in_file)


def test_a_redis_outage_spools_and_the_replay_adds_every_decision_once_in_order(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, redis_server: RedisServer
) -> None:
    gw = start(start_gateway, http_upstream, redis_server)
    redis_server.kill()
    # The gateway keeps deciding without redis: every request gets its answer.
    started = time.monotonic()
    assert send(gw, http_upstream, 40) == [200, 403] * 20
    assert time.monotonic() - started < 20
    assert len(gw.records(40)) == 40
    assert stream_records_or_none(redis_server) is None
    spool = gw.root / "state" / "audit" / "stream.spool"
    assert spool.stat().st_size > 0
    redis_server.start()  # empty, on the same port
    assert send(gw, http_upstream, 20) == [200, 403] * 10  # queued behind the spool, in order
    in_file = gw.records(60)
    wait_for(lambda: len(stream_records(redis_server)) >= 60)
    wait_for(lambda: spool.stat().st_size == 0)
    in_stream = stream_records(redis_server)
    assert len(in_stream) == 60 == len(in_file)
    assert [r["decision_id"] for r in in_stream] == [r["decision_id"] for r in in_file]
    assert len({r["decision_id"] for r in in_stream}) == 60
    assert "audit.stream_unavailable" in gw.log()


def stream_records_or_none(server: RedisServer) -> list[dict[str, Any]] | None:
    """None while the server is down."""
    try:
        return stream_records(server)
    except redis.ConnectionError:
        return None
