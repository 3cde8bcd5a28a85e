"""Fleet mode end to end: two real gateways sharing one real redis for sandboxes and reloads.

Sandboxes registered in redis (through the CLI) are served by every gateway without a
restart; one published reload is in force on both; losing redis keeps known sandboxes and
refuses unknown ones, and past max_staleness the redis-registered ones too. With several
workers per gateway (SANDGATE_TEST_WORKERS), each worker is a member of the fleet.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from conftest import OTHER_TOKEN, SANDGATE, TOKEN, GatewayFactory, RunningGateway, curl, tenant_yaml
from support import RecordingUpstream, RedisServer

pytestmark = pytest.mark.slow


def _workers() -> int:
    """Worker processes per gateway in this run (tests/conftest.py passes SANDGATE_WORKERS on)."""
    count = os.environ.get("SANDGATE_WORKERS", "1")
    return len(os.sched_getaffinity(0)) if count == "auto" else int(count)


def _members(gateway_id: str) -> list[str]:
    """The fleet members of the gateway with this id: itself, or each of its workers."""
    workers = _workers()
    return [gateway_id] if workers == 1 else [f"{gateway_id}-w{i}" for i in range(workers)]


def _epoch_files(gw: RunningGateway) -> list[Path]:
    """Where each member of the gateway remembers the fleet epoch (a worker: in its folder)."""
    state, workers = gw.root / "state", _workers()
    folders = [state] if workers == 1 else [state / "workers" / f"w{i}" for i in range(workers)]
    return [folder / "fleet-epoch" for folder in folders]


def _fleet_members() -> list[str]:
    """Every member of the fleet `_fleet` starts, sorted."""
    return sorted(_members("gw-a") + _members("gw-b"))


def _fleet(
    start_gateway: GatewayFactory, redis_server: RedisServer, upstream: RecordingUpstream, **redis: Any
) -> tuple[RunningGateway, RunningGateway]:
    rules = [{"hosts": ["api.test"], "ports": [upstream.port]}]
    gateways = []
    for name in ("gw-a", "gw-b"):
        cfg = {
            "redis": {"url": redis_server.url, "prefix": "fleet:", "gateway_id": name, **redis},
            "reload": {"watch": False},
        }
        gateways.append(start_gateway({"t1.yaml": tenant_yaml("t1", rules)}, config=cfg))
    return gateways[0], gateways[1]


def _cli(gw: RunningGateway, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, *args, "--config", str(gw.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=gw.root,
    )


def _status(gw: RunningGateway, upstream: RecordingUpstream, sandbox: str, token: str) -> str:
    result = curl(
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-x",
        gw.proxy(sandbox, token),
        upstream.url_for("api.test") + "/x",
    )
    return result.stdout


def _wait_status(
    gw: RunningGateway,
    upstream: RecordingUpstream,
    sandbox: str,
    token: str,
    want: str,
    timeout: float = 10.0,
) -> float:
    """Seconds until the gateway answers `want` for this sandbox (bounded polling)."""
    started = time.monotonic()
    last = ""
    while time.monotonic() - started < timeout:
        last = _status(gw, upstream, sandbox, token)
        if last == want:
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(
        f"gateway on {gw.port} answered {last}, not {want}, for {timeout}s:\n{gw.log()[-3000:]}"
    )


def _wait_last_reason(gw: RunningGateway, want: str, timeout: float = 5.0) -> None:
    """Wait until the newest decision record has this reason (the audit writer is a thread)."""
    deadline = time.monotonic() + timeout
    while True:
        records = gw.records(event="decision")
        if records and records[-1]["reason"] == want:
            return
        assert time.monotonic() < deadline, records[-1:] if records else "no records"
        time.sleep(0.05)


def _register(gw: RunningGateway, sandbox: str, token_env: str = "DYN_TOKEN") -> None:
    result = subprocess.run(
        [SANDGATE, "sandbox", "add", "--config", str(gw.root / "sandgate.yaml"),
         "--tenant", "t1", "--id", sandbox, "--token", f"env:{token_env}"],
        capture_output=True, text=True, timeout=30, cwd=gw.root,
        env={**os.environ, token_env: OTHER_TOKEN},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert OTHER_TOKEN not in result.stdout + result.stderr


def test_a_sandbox_registered_on_one_gateway_is_served_by_both(
    start_gateway: GatewayFactory, redis_server: RedisServer, http_upstream: RecordingUpstream
) -> None:
    a, b = _fleet(start_gateway, redis_server, http_upstream)
    assert _status(b, http_upstream, "dyn1", OTHER_TOKEN) == "407"
    _register(a, "dyn1")
    _wait_status(b, http_upstream, "dyn1", OTHER_TOKEN, "200")
    _wait_status(a, http_upstream, "dyn1", OTHER_TOKEN, "200")
    # Only with its own token; the static sandbox is untouched.
    assert _status(b, http_upstream, "dyn1", TOKEN) == "407"
    assert _status(b, http_upstream, "sb1", TOKEN) == "200"
    listed = json.loads(_cli(b, "sandbox", "list", "--format", "json").stdout)
    assert [(s["id"], s["defined_in"]) for s in listed if s["defined_in"] == "redis"] == [("dyn1", "redis")]
    assert listed[0]["token"].startswith("sha256:")
    # Removed through the other gateway's config: refused by both again.
    assert _cli(b, "sandbox", "remove", "dyn1").returncode == 0
    _wait_status(a, http_upstream, "dyn1", OTHER_TOKEN, "407")
    _wait_status(b, http_upstream, "dyn1", OTHER_TOKEN, "407")
    _wait_last_reason(b, "no_identity")


def test_one_published_reload_is_in_force_on_both_gateways(
    start_gateway: GatewayFactory, redis_server: RedisServer, http_upstream: RecordingUpstream
) -> None:
    a, b = _fleet(start_gateway, redis_server, http_upstream)
    for gw in (a, b):
        assert _status(gw, http_upstream, "sb1", TOKEN) == "200"
        gw.write_tenant("t1.yaml", tenant_yaml("t1", [{"hosts": ["open.test"]}]))
    # File watching is off: nothing changes until the reload is published.
    time.sleep(0.5)
    assert _status(a, http_upstream, "sb1", TOKEN) == "200"
    result = _cli(a, "policy", "reload")
    assert result.returncode == 0, result.stderr
    # The CLI waited for every live gateway's answer: both already serve the new policy.
    answers = sorted(
        line.split("\t")[0] for line in result.stdout.splitlines() if line.endswith("\treloaded")
    )
    assert answers == _fleet_members(), result.stdout
    assert _status(a, http_upstream, "sb1", TOKEN) == "403"
    assert _status(b, http_upstream, "sb1", TOKEN) == "403"
    # Both report the fleet version they serve.
    deadline = time.monotonic() + 5
    while True:
        status = json.loads(_cli(b, "policy", "status", "--format", "json").stdout)
        if all(g["in_sync"] for g in status["gateways"]) and len(status["gateways"]) == len(_fleet_members()):
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    assert sorted(g["gateway"] for g in status["gateways"]) == _fleet_members()


def test_losing_redis_keeps_known_sandboxes_and_refuses_unknown_ones(
    start_gateway: GatewayFactory, redis_server: RedisServer, http_upstream: RecordingUpstream
) -> None:
    a, b = _fleet(start_gateway, redis_server, http_upstream)
    _register(a, "dyn1")
    _wait_status(b, http_upstream, "dyn1", OTHER_TOKEN, "200")
    redis_server.kill()
    deadline = time.monotonic() + 10
    while "fleet.redis_unreachable" not in b.log():
        assert time.monotonic() < deadline, b.log()[-3000:]
        time.sleep(0.05)
    for gw in (a, b):
        assert _status(gw, http_upstream, "dyn1", OTHER_TOKEN) == "200"
        assert _status(gw, http_upstream, "dyn2", OTHER_TOKEN) == "407"
        _wait_last_reason(gw, "no_identity")
        assert gw.proc.poll() is None
    # The CLI fails loudly while redis is down; the gateway lists what it still serves.
    for args in (("sandbox", "remove", "dyn1"), ("policy", "reload")):
        result = _cli(a, *args)
        assert result.returncode == 2 and "unreachable" in result.stderr, (args, result.stderr)
    listed = _cli(a, "sandbox", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    served = {s["id"]: s["defined_in"] for s in json.loads(listed.stdout)}
    assert sorted(served) == ["dyn1", "sb1"] and served["dyn1"] == "redis"


def test_past_max_staleness_redis_sandboxes_are_dropped_and_come_back_with_redis(
    start_gateway: GatewayFactory, redis_server: RedisServer, http_upstream: RecordingUpstream
) -> None:
    a, b = _fleet(start_gateway, redis_server, http_upstream, max_staleness_seconds=1.5)
    _register(a, "dyn1")
    _wait_status(b, http_upstream, "dyn1", OTHER_TOKEN, "200")
    redis_server.kill()
    _wait_status(b, http_upstream, "dyn1", OTHER_TOKEN, "407", timeout=10)
    assert "fleet.registry_stale" in b.log()
    # Static sandboxes are not the registry's: still served.
    assert _status(b, http_upstream, "sb1", TOKEN) == "200"
    redis_server.start()  # empty: the sandbox must be registered again
    _register(a, "dyn1")
    _wait_status(b, http_upstream, "dyn1", OTHER_TOKEN, "200", timeout=15)
    _wait_status(a, http_upstream, "dyn1", OTHER_TOKEN, "200", timeout=15)
    assert "fleet.registry_restored" in b.log()


def test_a_gateway_that_refuses_a_reload_is_named_and_still_follows_the_registry(
    start_gateway: GatewayFactory, redis_server: RedisServer, http_upstream: RecordingUpstream
) -> None:
    a, b = _fleet(start_gateway, redis_server, http_upstream)
    (b.rules_dir / "base.yaml").write_text("deny:\n  - hots: [x.test]\n")  # b's own copy is broken
    result = _cli(a, "policy", "reload")
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = {line.split("\t")[0]: line for line in result.stdout.splitlines() if "\t" in line}
    assert sorted(lines) == _fleet_members(), result.stdout
    for member in _members("gw-a"):
        assert lines[member].endswith("\treloaded"), result.stdout
    for member in _members("gw-b"):
        assert "REFUSED: " in lines[member] and "base.yaml:2:" in lines[member], result.stdout
    assert "not every gateway serves the reloaded policy" in result.stderr
    status = json.loads(_cli(a, "policy", "status", "--format", "json").stdout)
    by_name = {g["gateway"]: g for g in status["gateways"]}
    for member in _members("gw-a"):
        assert by_name[member]["in_sync"] is True, status
    for member in _members("gw-b"):
        assert by_name[member]["in_sync"] is False and by_name[member]["last_reload"]["ok"] is False, status
    text = _cli(a, "policy", "status").stdout
    assert "reload REFUSED" in text and "last reload error: " in text
    # Registry changes do not depend on b's files loading: b serves the new sandbox too.
    _register(a, "dyn1")
    _wait_status(b, http_upstream, "dyn1", OTHER_TOKEN, "200")
    _wait_status(a, http_upstream, "dyn1", OTHER_TOKEN, "200")
    assert _status(b, http_upstream, "sb1", TOKEN) == "200"  # on its rules in force


def test_a_redis_replaced_by_an_empty_one_is_detected_loudly_and_fails_closed(
    start_gateway: GatewayFactory, redis_server: RedisServer, http_upstream: RecordingUpstream
) -> None:
    a, b = _fleet(start_gateway, redis_server, http_upstream)
    _register(a, "dyn1")
    _wait_status(b, http_upstream, "dyn1", OTHER_TOKEN, "200")
    client = redis.Redis.from_url(redis_server.url)
    epoch = client.get("fleet:epoch")
    assert isinstance(epoch, bytes)
    for gw in (a, b):  # remembered across restarts, by every member
        for path in _epoch_files(gw):
            assert path.read_text().strip() == epoch.decode(), path
    client.flushall()
    client.close()
    workers = _workers()
    for gw in (a, b):
        deadline = time.monotonic() + 10
        while gw.log().count("fleet.redis_replaced") < workers:  # each member notices
            assert time.monotonic() < deadline, gw.log()[-3000:]
            time.sleep(0.05)
        _wait_status(gw, http_upstream, "dyn1", OTHER_TOKEN, "407")  # gone with the data: fail closed
        # Once per member; the gateway's metrics add up its workers' (each answers in time or
        # is left out of one scrape: a loaded host is given a few).
        want = f"sandgate_fleet_redis_replaced_total {workers}.0"
        sock = str(gw.root / "state" / "admin.sock")
        with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://sandgate") as api:
            deadline = time.monotonic() + 10
            while want not in (text := api.get("/metrics").text):
                assert time.monotonic() < deadline, text
                time.sleep(0.1)
    assert _status(a, http_upstream, "sb1", TOKEN) == "200"  # file sandboxes are unaffected


def test_a_reload_the_local_gateway_refuses_still_reaches_the_fleet(
    start_gateway: GatewayFactory, redis_server: RedisServer, http_upstream: RecordingUpstream
) -> None:
    a, b = _fleet(start_gateway, redis_server, http_upstream)
    (a.rules_dir / "base.yaml").write_text("deny:\n  - hots: [x.test]\n")  # the local copy is broken
    b.write_tenant("t1.yaml", tenant_yaml("t1", [{"hosts": ["open.test"]}]))
    result = _cli(a, "policy", "reload")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "reload REFUSED" in result.stderr and "base.yaml:2:" in result.stderr
    lines = {line.split("\t")[0]: line for line in result.stdout.splitlines() if "\t" in line}
    assert sorted(lines) == _fleet_members(), result.stdout
    for member in _members("gw-b"):
        assert lines[member].endswith("\treloaded"), result.stdout
    for member in _members("gw-a"):
        assert "REFUSED: " in lines[member] and "base.yaml:2:" in lines[member], result.stdout
    assert _status(b, http_upstream, "sb1", TOKEN) == "403", "b serves its new files"
    assert _status(a, http_upstream, "sb1", TOKEN) == "200", "a keeps the policy in force"
