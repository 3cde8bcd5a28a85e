"""SIEM sinks in a real gateway: attached at the one writer (with two workers, the
supervisor's collector: one queue per sink, records settled after a worker's death included),
a queue left by a stopped gateway sent by the next start, and a full queue that drops for the
sink while the trail stays complete."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import SANDGATE, GatewayFactory, curl, tenant_yaml
from support import RecordingUpstream
from support.processes import gateway_status, wait_until
from support.siem_gateway import expected_ids, sink_metrics
from support.siem_http import SiemReceiver
from support.siem_lines import wait_for

pytestmark = pytest.mark.slow


def hec_sink(receiver: SiemReceiver, **extra: Any) -> dict[str, Any]:
    return {
        "type": "hec",
        "name": "hec",
        "format": "native",
        "url": receiver.url,
        "token": "env:SIEM_TOKEN",
        "max_backoff_seconds": 0.5,
        **extra,
    }


def status_text(config: str) -> str:
    return subprocess.run([SANDGATE, "status", "--config", config], capture_output=True, text=True).stdout


def tenants(upstream: RecordingUpstream) -> dict[str, str]:
    return {"t1.yaml": tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [upstream.port]}])}


def test_two_workers_feed_one_queue_per_sink_at_the_collector(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    receiver = SiemReceiver(hec_token="token-two-workers").start()
    try:
        gw = start_gateway(
            tenants(http_upstream),
            config={"audit": {"sinks": [hec_sink(receiver)]}, "reload": {"watch": False}},
            env={"SANDGATE_WORKERS": "2", "SIEM_TOKEN": "token-two-workers"},
        )
        status = wait_until(lambda: gateway_status(gw), "both workers to serve")
        url = f"{http_upstream.url_for('api.test')}/x"
        for _ in range(20):  # a new connection each: the kernel spreads them over both workers
            assert curl("-o", "/dev/null", "-w", "%{http_code}", "-x", gw.proxy(), url).stdout == "200"
        os.kill(status["worker_pids"][1], signal.SIGKILL)  # what it left is settled by the collector
        wait_until(
            lambda: curl("-o", "/dev/null", "-w", "%{http_code}", "-x", gw.proxy(), url).stdout == "200",
            "an answer after the kill",
        )
        for _ in range(10):
            curl("-o", "/dev/null", "-x", gw.proxy(), url)
        records = gw.records(30)
        assert {r["worker"] for r in records} == {0, 1}
        admin = gw.root / "state" / "admin.sock"
        wanted = {r["decision_id"] for r in records}
        wait_for(lambda: wanted <= set(receiver.uids()), "delivery")
        # The lead reports the collector's sink once (from its figures file, about once a second).
        delivered = wait_for(
            lambda: (
                (n := sink_metrics(admin)[("sandgate_audit_sink_delivered_total", "hec")])
                == len(set(receiver.uids()))
                and n
            ),
            "the delivered count in /metrics",
        )
        config = str(gw.root / "sandgate.yaml")
        shown = wait_for(
            lambda: "audit sink hec (hec): " in (out := status_text(config)) and out,
            "the sink's line in sandgate status",
        )
        assert f"audit sink hec (hec): {int(delivered)} delivered, 0 bytes queued" in shown
        assert gw.stop() == 0
        assert set(receiver.uids()) == set(expected_ids(gw.audit_path, "native"))
        queues = sorted(p.relative_to(gw.root) for p in gw.root.rglob("*.seg"))
        assert [q.parent for q in queues] == [Path("state/audit/sinks/hec")]
    finally:
        receiver.stop()


def test_a_queue_left_by_a_stopped_gateway_is_sent_by_the_next_start(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    receiver = SiemReceiver(hec_token="token-restart").start()
    receiver.stop()  # away while the first gateway runs
    state = tmp_path / "shared-state"
    config = {"state_dir": str(state), "audit": {"sinks": [hec_sink(receiver)]}, "reload": {"watch": False}}
    env = {"SIEM_TOKEN": "token-restart"}
    first = start_gateway(tenants(http_upstream), config=config, env=env)
    url = f"{http_upstream.url_for('api.test')}/x"
    for _ in range(15):
        assert curl("-o", "/dev/null", "-w", "%{http_code}", "-x", first.proxy(), url).stdout == "200"
    first.records(15)
    assert first.stop() == 0
    assert receiver.uids() == []
    receiver.start()
    try:
        second = start_gateway(tenants(http_upstream), config=config, env=env)
        trail = state / "audit" / "audit.jsonl"
        wanted = set(expected_ids(trail, "native"))
        assert len(wanted) >= 15
        wait_for(lambda: wanted <= set(receiver.uids()), "the first gateway's records", timeout=20)
        assert second.stop() == 0
    finally:
        receiver.stop()


def test_a_full_queue_drops_for_the_sink_and_the_trail_stays_complete(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    receiver = SiemReceiver(hec_token="token-full").start()
    receiver.stop()
    gw = start_gateway(
        tenants(http_upstream),
        config={"audit": {"sinks": [hec_sink(receiver, max_spool_bytes=65_536)]}, "reload": {"watch": False}},
        env={"SIEM_TOKEN": "token-full"},
    )
    url = f"{http_upstream.url_for('api.test')}/x"
    for _ in range(30):
        # Many requests per curl: one connection, so the test stays short.
        done = curl("-w", "%{http_code}\\n", "-x", gw.proxy(), *["-o", "/dev/null", url] * 10)
        assert done.stdout.split() == ["200"] * 10
    assert len(gw.records(300)) == 300  # every decision in the trail
    admin = gw.root / "state" / "admin.sock"
    metrics = wait_for(
        lambda: (m := sink_metrics(admin)).get(("sandgate_audit_sink_dropped_total", "hec/full")) and m,
        "drops counted",
    )
    spooled = metrics[("sandgate_audit_sink_spooled_total", "hec")]
    assert spooled + metrics[("sandgate_audit_sink_dropped_total", "hec/full")] == 300
    assert metrics[("sandgate_audit_sink_queue_bytes", "hec")] <= 65_536
    assert gw.log().count('"audit.sink_full"') == 1
    assert gw.stop() == 0


def couriers(parent: int) -> list[int]:
    """The pids of `parent`'s courier children (sandgate.proxy.audit.sinks.courier)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == parent and b"sandgate.proxy.audit.sinks.courier" in cmdline:
            found.append(int(proc.name))
    return found


def pid_alive(pid: int) -> bool:
    try:
        return "Z" not in (Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0])
    except OSError:
        return False


def test_a_one_process_gateway_delivers_from_a_courier_process_kept_running(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    """Delivery is off the deciding process's interpreter lock: a child process delivers, is
    restarted when it dies (nothing lost), and ends with the gateway, even a killed one."""
    receiver = SiemReceiver(hec_token="token-courier").start()
    try:
        gw = start_gateway(
            tenants(http_upstream),
            config={"audit": {"sinks": [hec_sink(receiver)]}, "reload": {"watch": False}},
            env={"SIEM_TOKEN": "token-courier"},
        )
        first = wait_for(lambda: couriers(gw.proc.pid), "the courier process")
        assert len(first) == 1
        url = f"{http_upstream.url_for('api.test')}/x"
        for _ in range(5):
            assert curl("-o", "/dev/null", "-w", "%{http_code}", "-x", gw.proxy(), url).stdout == "200"
        wanted = {r["decision_id"] for r in gw.records(5)}
        wait_for(lambda: wanted <= set(receiver.uids()), "delivery by the courier")
        # `sandgate status` reads the courier's count beside the gateway's own.
        config = str(gw.root / "sandgate.yaml")
        wait_for(
            lambda: f"audit sink hec (hec): {len(set(receiver.uids()))} delivered" in status_text(config),
            "the courier's count in sandgate status",
        )
        os.kill(first[0], signal.SIGKILL)
        for _ in range(5):
            assert curl("-o", "/dev/null", "-w", "%{http_code}", "-x", gw.proxy(), url).stdout == "200"
        second = wait_for(lambda: [p for p in couriers(gw.proc.pid) if p != first[0]], "a new courier")
        wanted = {r["decision_id"] for r in gw.records(10)}
        wait_for(lambda: wanted <= set(receiver.uids()), "delivery after the restart")
        assert '"audit.courier_exited"' in gw.log()
        gw.proc.kill()  # the gateway dies: its courier ends with it
        gw.proc.wait(10)
        wait_for(lambda: not pid_alive(second[0]), "the courier to end with the gateway")
    finally:
        receiver.stop()
