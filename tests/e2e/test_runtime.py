"""The gateway process: start-up, broken policy at start and at reload, fail-closed on faults."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import TOKEN, GatewayFactory, RunningGateway, tenant_yaml, write_gateway_files
from support import RecordingUpstream, wait_for_port

from sandgate.policy.resolver import Resolution
from sandgate.proxy.config import load_config
from sandgate.proxy.runtime import Gateway

pytestmark = pytest.mark.slow


def test_a_broken_operator_file_stops_the_gateway_from_starting(start_gateway: GatewayFactory) -> None:
    # A broken tenant file takes only its tenant (tests/e2e/test_policy_files.py); the
    # operator's base rules are never isolated.
    gw = start_gateway(
        {"t1.yaml": tenant_yaml("t1", [])}, base="deny:\n  - hosts: [Evil.Test]\n", expect_exit=True
    )
    assert gw.proc.returncode == 2
    assert "base.yaml:2:" in gw.log()
    assert "deny.0.hosts.0" in gw.log()
    assert "use 'evil.test' instead" in gw.log()


def test_a_broken_reload_keeps_the_last_good_policy(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)})
    url = f"{http_upstream.url_for('api.test')}/x"
    with httpx.Client(proxy=gw.proxy()) as c:
        assert c.get(url).status_code == 200
        good_version = gw.records(1)[0]["policy_version"]
        gw.write_tenant("t1.yaml", "tenant: t1\nallow:\n  - hosts: [api.test]\n    prots: [1]\n")
        gw.reload()
        # The watcher may reload the same change too: the SIGHUP's own record is the one checked.
        reload_rec = _reload_record(gw, lambda r: r["trigger"] == "sighup")
        # The reload went through for the rest; t1 keeps its last good version.
        assert reload_rec["result"] == "ok"
        (problem,) = reload_rec["tenant_errors"]
        assert problem["tenant"] == "t1" and problem["kept_last_good"] is True
        assert "t1.yaml:4:5: allow.0.prots: unknown key (did you mean 'ports'?)" in problem["errors"][0]
        assert c.get(url).status_code == 200, "the last good policy is still in force"
        assert gw.records(2)[1]["policy_version"] == good_version
        # A fixed file on disk is picked up by the watcher, no signal needed.
        gw.write_tenant("t1.yaml", tenant_yaml("t1", []))
        fixed = _reload_record(gw, lambda r: r["tenant_errors"] == [])
        assert fixed["trigger"] == "file_change" and fixed["result"] == "ok"
        assert c.get(url).status_code == 403
    assert "policy.tenant_load_failed" in gw.log()


def _reload_record(gw: RunningGateway, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first policy_reload record that `match` selects, waiting up to 15 s for it."""
    deadline = time.monotonic() + 15
    while True:
        found = [r for r in gw.records(event="policy_reload") if match(r)]
        if found or time.monotonic() > deadline:
            assert found, f"no such reload record in {gw.records(event='policy_reload')}"
            return found[0]
        time.sleep(0.05)


class ExplodingResolver:
    """A real Resolver whose lookups fail with an unexpected fault (not a DNS failure)."""

    def __init__(self) -> None:
        self.calls = 0

    async def resolve(self, host: str) -> Resolution:
        self.calls += 1
        raise RuntimeError("resolver crashed")


async def test_an_exception_inside_a_step_denies_with_internal_error(
    tmp_path: Path, http_upstream: RecordingUpstream
) -> None:
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    config_path, port = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", rules)})
    resolver = ExplodingResolver()
    gateway = Gateway(load_config(config_path), resolver=resolver)
    task = asyncio.create_task(gateway.run(signals=False))
    try:
        await asyncio.wait_for(gateway.ready.wait(), 20)
        async with httpx.AsyncClient(proxy=f"http://sb1:{TOKEN}@127.0.0.1:{port}") as c:
            resp = await c.get(f"{http_upstream.url_for('api.test')}/x")
            # A policy object that raises on every use: each hook must fail closed.
            gateway.ctx.policy = None  # type: ignore[assignment]
            resp2 = await c.get(f"{http_upstream.url_for('api.test')}/y")
    finally:
        gateway.shutdown()
        assert await asyncio.wait_for(task, 20) == 0
    assert resolver.calls == 1
    assert (resp.status_code, resp.headers["X-Sandgate-Reason"]) == (403, "internal_error")
    assert resp2.status_code == 403
    assert http_upstream.connections == []
    records = [line for line in (tmp_path / "state" / "audit" / "audit.jsonl").read_text().splitlines()]
    assert '"reason":"internal_error"' in records[0]


def test_the_gateway_stops_cleanly_on_sigterm(start_gateway: GatewayFactory) -> None:
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", [])})
    deadline = time.monotonic() + 20
    while "gateway.ready" not in gw.log() and time.monotonic() < deadline:
        time.sleep(0.05)  # the port opens a moment before the ready event is logged
    started = time.monotonic()
    assert gw.stop() == 0
    assert time.monotonic() - started < 10
    assert "gateway.ready" in gw.log()


def test_a_taken_port_is_a_start_up_failure(start_gateway: GatewayFactory, tmp_path: Path) -> None:
    first = start_gateway({"t1.yaml": tenant_yaml("t1", [])})
    config_path, _ = write_gateway_files(
        tmp_path / "second", {"t1.yaml": tenant_yaml("t1", [])}, port=first.port
    )
    import subprocess

    from conftest import SANDGATE

    proc = subprocess.run(
        [SANDGATE, "run", "--config", str(config_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    # Before anything starts (tests/e2e/test_bindcheck.py has every listener).
    assert (
        proc.stderr
        == f"sandgate: proxy listener 127.0.0.1:{first.port}: port {first.port} is in use: pass a free one with --port\n"
    )
    wait_for_port("127.0.0.1", first.port)
