"""Nothing lost when a process dies: a worker or the supervisor killed with requests at a slow
upstream, real `sandgate run` processes with two workers, counted from the upstream's side, the
client's side and the trail's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SANDGATE, GatewayFactory, RunningGateway, curl, tenant_yaml
from support import RecordingUpstream, wait_for_port
from support.processes import alive, gateway_status, wait_until

pytestmark = pytest.mark.slow

TWO = {"SANDGATE_WORKERS": "2"}


class Clients:
    """`count` requests (each its own connection, path /r<i>) sent at once; their status codes."""

    def __init__(self, gw: RunningGateway, url: str, count: int) -> None:
        self.codes: dict[int, str] = {}
        self._threads = [
            threading.Thread(target=self._one, args=(gw, f"{url}/r{i}", i)) for i in range(count)
        ]
        for t in self._threads:
            t.start()

    def _one(self, gw: RunningGateway, url: str, i: int) -> None:
        done = curl("-o", "/dev/null", "-w", "%{http_code}", "-m", "30", "-x", gw.proxy(), url)
        self.codes[i] = done.stdout

    def join(self) -> dict[int, str]:
        for t in self._threads:
            t.join(60)
        return self.codes


def trail(root: Path) -> list[dict[str, Any]]:
    """Every decision record in the trail (the active file: the tests write little)."""
    path = root / "state" / "audit" / "audit.jsonl"
    import json

    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, lines) if r.get("event") == "decision"]


def assert_each_request_recorded_once(upstream: RecordingUpstream, records: list[dict[str, Any]]) -> None:
    """Each request the upstream saw has exactly one record; no record appears twice."""
    ids = Counter(r["decision_id"] for r in records)
    assert not [i for i, n in ids.items() if n > 1], "a record written twice"
    by_path = Counter(r["path"] for r in records if r["phase"] == "request")
    seen = [r.target for r in upstream.requests]
    missing = [p for p in seen if by_path[p] == 0]
    assert not missing, f"{len(missing)} of {len(seen)} requests reached the upstream with no record"
    assert not [p for p in seen if by_path[p] > 1]


@pytest.mark.parametrize("fsync", ["off", "per_batch"])
def test_a_worker_killed_with_requests_upstream_leaves_none_unrecorded(
    start_gateway: GatewayFactory, fsync: str
) -> None:
    with RecordingUpstream("127.0.0.2", delay=2.0) as upstream:
        rules = [{"hosts": ["api.test"], "ports": [upstream.port]}]
        gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)}, config={"audit": {"fsync": fsync}}, env=TWO)
        status = wait_until(lambda: gateway_status(gw), "both workers to serve")
        victim = status["worker_pids"][1]
        clients = Clients(gw, f"http://api.test:{upstream.port}", 16)
        upstream.wait_for_requests(16, timeout=20)
        os.kill(victim, signal.SIGKILL)
        codes = clients.join()
        wait_until(lambda: not alive(victim), "the worker to die")
        # The supervisor writes the dead worker's open intents before it restarts it.
        records = gw.records_until(lambda rs: len([r for r in rs if r["phase"] == "request"]) >= 16)
        admin = httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock")))

        def cut_metric() -> float | None:
            text = admin.get("http://sandgate/metrics").text
            line = next(x for x in text.splitlines() if x.startswith("sandgate_audit_cut_by_exit_total "))
            return float(line.split()[1]) or None

        counted = wait_until(cut_metric, "the cut records counted")
        admin.close()
        assert gw.stop() == 0
    records = trail(gw.root)
    assert_each_request_recorded_once(upstream, records)
    cut = [r for r in records if r.get("error") == "cut by worker exit"]
    answered = [i for i, code in codes.items() if code == "200"]
    assert cut and len(cut) + len(answered) == 16, (len(cut), codes)
    assert {(r["decision"], r["worker"], r["status"]) for r in cut} == {("allow", 1, None)}
    assert '"audit.cut_by_exit"' in gw.log()
    assert counted == len(cut)
    assert not list((gw.root / "state" / "workers").glob("w*/intents-*.log")), "settled journals stay"


def start_again(root: Path, port: int) -> subprocess.Popen[bytes]:
    """The same gateway (its folder, config and port) started again, with two workers."""
    with (root / "gateway-again.log").open("ab") as log:
        proc = subprocess.Popen(
            [SANDGATE, "run", "--config", str(root / "sandgate.yaml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **TWO},
        )
    wait_for_port("127.0.0.1", port, timeout=90)
    return proc


@pytest.mark.parametrize(
    "restart",
    ["after", "during"],
    ids=["restarted once the old workers are gone", "restarted while the old workers still drain"],
)
def test_a_killed_supervisor_loses_no_record(start_gateway: GatewayFactory, restart: str) -> None:
    with RecordingUpstream("127.0.0.2", delay=2.5) as upstream:
        rules = [{"hosts": ["api.test"], "ports": [upstream.port]}]
        gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)}, env=TWO)
        status = wait_until(lambda: gateway_status(gw), "both workers to serve")
        workers: list[int] = status["worker_pids"]
        clients = Clients(gw, f"http://api.test:{upstream.port}", 12)
        upstream.wait_for_requests(12, timeout=20)
        gw.proc.kill()
        gw.proc.wait(5)
        again = None
        try:
            if restart == "during":
                time.sleep(0.3)
                again = start_again(gw.root, gw.port)
            codes = clients.join()
            wait_until(lambda: not any(alive(p) for p in workers), "the old workers to drain and exit", 40)
            # The old workers drained (every request answered) and spooled what they could not hand over.
            assert list(codes.values()) == ["200"] * 12
            old_log = gw.log()
            assert old_log.count('"worker.supervisor_gone"') == 2
            assert '"second_signal"' not in old_log
            spooled = [line for line in old_log.splitlines() if '"audit.spooled"' in line]
            assert len(spooled) == 2 and all('"lost": 0' in line for line in spooled), spooled
            if again is None:
                again = start_again(gw.root, gw.port)

            def merged() -> list[dict[str, Any]] | None:
                records = trail(gw.root)
                requests = [r for r in records if r["phase"] == "request" and r["path"].startswith("/r")]
                return records if len(requests) >= 12 else None

            records = wait_until(merged, "the spools merged into the trail", 30)
        finally:
            if again is not None:
                again.send_signal(signal.SIGTERM)
                again.wait(30)
    assert_each_request_recorded_once(upstream, records)
    assert not [r for r in records if r["phase"] == "request" and r.get("error")], "answered, so not cut"
    assert not list((gw.root / "state" / "workers").glob("w*/spool-*.jsonl")), "merged spools stay"
