"""Tamper evidence with two workers: the supervisor's collector is the one writer, so the trail
is one hash chain, which `sandgate audit verify` (a real process) passes; `status` shows the key."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from conftest import SANDGATE, GatewayFactory, curl, tenant_yaml
from support import RecordingUpstream
from support.processes import gateway_status, wait_until

from sandgate.proxy.audit.chain import GENESIS

pytestmark = pytest.mark.slow


def test_two_workers_write_one_chain_that_verifies(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    gw = start_gateway(
        {"t1.yaml": tenant_yaml("t1", rules)},
        config={"reload": {"watch": False}},
        env={"SANDGATE_WORKERS": "2"},
    )
    wait_until(lambda: gateway_status(gw), "both workers to serve")
    config = str(gw.root / "sandgate.yaml")
    status = subprocess.run([SANDGATE, "status", "--config", config], capture_output=True, text=True)
    assert status.returncode == 0 and "audit signing key: ed25519 " in status.stdout
    assert "-----BEGIN PUBLIC KEY-----" in status.stdout and "PRIVATE" not in status.stdout
    url = f"{http_upstream.url_for('api.test')}/x"
    for _ in range(20):  # a new connection each: the kernel spreads them over both workers
        done = curl("-o", "/dev/null", "-w", "%{http_code}", "-x", gw.proxy(), url)
        assert done.stdout == "200"
    assert sorted({r["worker"] for r in gw.records(20)}) == [0, 1]
    assert gw.stop() == 0
    lines = [json.loads(x) for x in gw.audit_path.read_text().splitlines()]
    assert lines[0]["prev"] == GENESIS and lines[-1]["event"] == "checkpoint"  # one at close
    done = subprocess.run(
        [SANDGATE, "audit", "verify", "--config", config, "--format", "json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = json.loads(done.stdout)
    assert (
        verdict["ok"]
        and verdict["start"] == "genesis"
        and verdict["records"] == len(lines) - verdict["checkpoints"]
    )
    assert "PRIVATE" not in gw.log()


def test_a_killed_worker_leaves_the_chain_whole(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    """A worker killed mid-traffic: the collector writes only whole batches, so the chain the
    supervisor keeps verifies after the restart, the settled intents and the stop."""
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    gw = start_gateway(
        {"t1.yaml": tenant_yaml("t1", rules)},
        config={"reload": {"watch": False}},
        env={"SANDGATE_WORKERS": "2"},
    )
    status = wait_until(lambda: gateway_status(gw), "both workers to serve")
    url = f"{http_upstream.url_for('api.test')}/x"
    for _ in range(10):
        curl("-o", "/dev/null", "-x", gw.proxy(), url)
    os.kill(status["worker_pids"][1], signal.SIGKILL)
    wait_until(
        lambda: curl("-o", "/dev/null", "-w", "%{http_code}", "-x", gw.proxy(), url).stdout == "200",
        "an answer",
    )
    for _ in range(10):
        curl("-o", "/dev/null", "-x", gw.proxy(), url)
    assert gw.stop() == 0
    config = str(gw.root / "sandgate.yaml")
    done = subprocess.run([SANDGATE, "audit", "verify", "--config", config], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("intact: ") and "chain start genesis" in done.stdout
