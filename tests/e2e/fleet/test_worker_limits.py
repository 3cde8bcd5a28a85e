"""End to end: two gateway workers sharing one limit relay enforce a tenant's limits together."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from conftest import GatewayFactory, Gateways, RunningGateway, tenant_yaml
from support import RecordingUpstream, TestPKI, wait_for_presence_since

from sandgate.proxy.audit.collector import AuditCollector
from sandgate.proxy.audit.trail import JsonlFileSink
from sandgate.proxy.fleet.limits_sync import RELAY_ENV as ENV
from sandgate.proxy.state.unix_sockets import ensure_private_folder, internal_socket_folder
from sandgate.proxy.worker_role import ENV as WORKER_ENV
from sandgate.proxy.workers.limit_relay import LimitRelay

pytestmark = pytest.mark.slow


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LimitRelay]:
    with LimitRelay(tmp_path / "broker") as b:
        yield b


@pytest.fixture
def start_gateway(tmp_path: Path, pki: TestPKI) -> Iterator[GatewayFactory]:
    """Workers as the supervisor starts them, each with the audit collector the supervisor
    would run for it; the collectors close after the workers stopped (a worker stopping
    without one waits out its audit close timeout)."""
    collectors: list[AuditCollector] = []

    def with_collector(root: Path) -> None:
        state = root / "state"
        sink = JsonlFileSink(state / "audit" / "audit.jsonl", max_bytes=10**9, backups=1)
        collector = AuditCollector(ensure_private_folder(internal_socket_folder(state)) / "audit.sock", sink)
        collector.start()
        collectors.append(collector)

    gateways = Gateways(tmp_path, pki)

    def start(tenants: dict[str, str], **kwargs: Any) -> RunningGateway:
        return gateways.start(tenants, prepare=with_collector, **kwargs)

    yield start
    gateways.close()
    for collector in collectors:
        collector.close()


def limited_tenant(upstream: RecordingUpstream, **limits: int) -> dict[str, str]:
    doc = yaml.safe_load(tenant_yaml("t1", [{"id": "api", "hosts": ["api.test"], "ports": [upstream.port]}]))
    doc["limits"] = limits
    return {"t1.yaml": yaml.safe_dump(doc, sort_keys=False)}


def workers(start: GatewayFactory, broker: LimitRelay, tenants: dict[str, str]) -> list[RunningGateway]:
    """Workers 0 and 1 of 2 (on their own explicit ports), as the supervisor would start them."""
    config: dict[str, Any] = {"limits_sync": {"interval_seconds": 0.05}}
    return [start(tenants, config=config, env={WORKER_ENV: f"{i}/2", ENV: broker.url}) for i in range(2)]


def shared_total(broker: LimitRelay, kind: str) -> int:
    client = redis.Redis.from_url(broker.url)
    try:
        return sum(
            int(client.get(k) or 0) for k in client.scan_iter(f"sandgate:local:limits:tenant:t1:{kind}:*")
        )
    finally:
        client.close()


def wait_for_total(broker: LimitRelay, kind: str, expected: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while (total := shared_total(broker, kind)) != expected:
        assert time.monotonic() < deadline, f"shared {kind} total {total}, expected {expected}"
        time.sleep(0.02)


def send(gw: RunningGateway, upstream: RecordingUpstream, count: int, **kwargs: Any) -> list[int]:
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        return [c.post(f"{upstream.url_for('api.test')}/r{i}", **kwargs).status_code for i in range(count)]


def test_a_tenant_request_limit_holds_across_two_workers(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, broker: LimitRelay
) -> None:
    w0, w1 = workers(start_gateway, broker, limited_tenant(http_upstream, tenant_requests_per_minute=10))
    assert send(w0, http_upstream, 6) == [200] * 6
    wait_for_total(broker, "requests", 6)
    # At once, from six connections: w1 learns w0's 6 before its first decision on the sandbox.
    with ThreadPoolExecutor(6) as pool:
        through_w1 = [s for ss in pool.map(lambda _: send(w1, http_upstream, 1), range(6)) for s in ss]
    assert sorted(through_w1) == [200] * 4 + [429] * 2
    wait_for_total(broker, "requests", 10)
    # w0's counter is idle: it reads the shared total again at its next refresh (about once a
    # second); until then it may admit what w1 admitted meanwhile (the documented overshoot).
    wait_for_presence_since(broker.url, "sandgate:local:limits:gateways", ["w0"], time.time())
    # Used up for the gateway as a whole: neither worker admits more.
    assert send(w0, http_upstream, 2) == [429] * 2
    assert send(w1, http_upstream, 2) == [429] * 2
    assert len(http_upstream.requests) == 10


def test_a_tenant_byte_budget_spent_on_one_worker_is_spent_on_the_other(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, broker: LimitRelay
) -> None:
    w0, w1 = workers(
        start_gateway, broker, limited_tenant(http_upstream, tenant_egress_bytes_per_hour=20_000)
    )
    assert send(w0, http_upstream, 1, content=b"x" * 15_000) == [200]
    deadline = time.monotonic() + 5
    while shared_total(broker, "egress_bytes") < 15_000:
        assert time.monotonic() < deadline, "w0's bytes never reached the broker"
        time.sleep(0.02)
    # 10 kB would fit in w1's own count; with w0's 15 kB the gateway's budget has no room.
    assert send(w1, http_upstream, 1, content=b"y" * 10_000) == [429]
    assert send(w1, http_upstream, 1, content=b"z" * 100) == [200]
    assert len(http_upstream.requests) == 2
