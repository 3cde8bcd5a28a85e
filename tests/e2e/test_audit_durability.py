"""Audit durability through a real gateway: a full disk, a full queue, kill -9 with per_batch fsync."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import GatewayFactory, RunningGateway, tenant_yaml
from support import RecordingUpstream, SmallDisk
from support.processes import alive, wait_until

pytestmark = pytest.mark.slow


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_records(path: Path, count: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = [r for r in read_records(path) if r.get("event") == "decision"]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def scrape_unrecorded(gw: RunningGateway) -> float:
    transport = httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock"))
    with httpx.Client(transport=transport, base_url="http://sandgate", timeout=10) as c:
        text = c.get("/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("sandgate_audit_unrecorded_denials_total "))
    return float(line.split()[1])


def allow_upstream(upstream: RecordingUpstream) -> dict[str, str]:
    return {"t1.yaml": tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [upstream.port]}])}


@pytest.mark.root
def test_a_full_disk_keeps_every_record_exactly_once(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    with SmallDisk(tmp_path / "disk", size="1m") as disk:
        audit = disk.path / "audit.jsonl"
        gw = start_gateway(allow_upstream(http_upstream), config={"audit": {"path": str(audit)}})
        base = http_upstream.url_for("api.test")
        with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
            for i in range(3):
                assert c.get(f"{base}/before{i}").status_code == 200
            assert len(wait_records(audit, 3)) == 3
            disk.fill()
            for i in range(40):
                assert c.get(f"{base}/full{i}").status_code == 200
            time.sleep(2.0)  # the writer retries the batch it holds several times
            assert "audit.write_failed" in gw.log()
            disk.free()
            records = wait_records(audit, 43)
    ids = [r["decision_id"] for r in records]
    paths = [r["path"] for r in records]
    assert len(ids) == len(set(ids)), "a retried batch was written more than once"
    assert sorted(paths) == sorted([f"/before{i}" for i in range(3)] + [f"/full{i}" for i in range(40)])


@pytest.mark.root
def test_a_full_queue_denies_before_anything_goes_upstream(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    # The writer is stuck on a full disk; the queue holds 4 records; a decision waits 0.5 s.
    with SmallDisk(tmp_path / "disk", size="1m") as disk:
        audit = disk.path / "audit.jsonl"
        gw = start_gateway(
            allow_upstream(http_upstream),
            config={"audit": {"path": str(audit), "queue_size": 4, "max_wait_seconds": 0.5}},
        )
        base = http_upstream.url_for("api.test")
        disk.fill()
        answers: dict[str, httpx.Response] = {}
        with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
            for i in range(10):
                answers[f"/q{i}"] = c.get(f"{base}/q{i}")
            refused = [p for p, r in answers.items() if r.status_code == 403]
            assert refused, "a request without a place for its record must be denied"
            for p in refused:
                assert answers[p].headers["X-Sandgate-Reason"] == "internal_error"
            # Only requests with a place for their record went upstream, each answered 200.
            forwarded = sorted(r.target for r in http_upstream.requests)
            answered = sorted(p for p, r in answers.items() if r.status_code == 200)
            assert forwarded == answered and len(answered) + len(refused) == 10
            # The other tenant-less traffic: a denial that cannot be recorded is still a denial.
            denied = c.get(f"{http_upstream.url_for('other.test')}/nope")
            assert denied.status_code == 403
            assert scrape_unrecorded(gw) == len(refused) + 1
        assert "audit.unrecorded" in gw.log()
        disk.free()
        records = wait_records(audit, len(answered))
    assert sorted(r["path"] for r in records if r["decision"] == "allow") == answered
    assert all(r["status"] == 200 for r in records if r["decision"] == "allow")


def test_kill_9_with_per_batch_fsync_loses_no_answered_request(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway(allow_upstream(http_upstream), config={"audit": {"fsync": "per_batch"}})
    base = http_upstream.url_for("api.test")
    answered: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def load(worker: int) -> None:
        with httpx.Client(proxy=gw.proxy(), timeout=5) as c:
            for i in range(400):
                if stop.is_set():
                    return
                path = f"/k{worker}-{i}"
                try:
                    if c.get(f"{base}{path}").status_code == 200:
                        with lock:
                            answered.append(path)
                except httpx.HTTPError:
                    return

    workers = [threading.Thread(target=load, args=(w,)) for w in range(4)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 15
    while len(answered) < 60 and time.monotonic() < deadline:
        time.sleep(0.02)
    gw.proc.send_signal(signal.SIGKILL)
    gw.proc.wait(10)
    stop.set()
    for w in workers:
        w.join(15)
    assert len(answered) >= 60
    recorded = {r["path"] for r in on_disk(gw) if r.get("decision") == "allow"}
    missing = [p for p in answered if p not in recorded]
    assert not missing, f"{len(missing)} answered requests have no record on disk"


def on_disk(gw: RunningGateway) -> list[dict[str, Any]]:
    """The records on disk once the gateway's processes are gone: the trail, and with workers
    the spools of a killed supervisor's workers, which drained and wrote there what the
    collector could no longer take (merged at the next start: tests/e2e/workers)."""
    status = gw.root / "state" / "gateway.json"
    pids = json.loads(status.read_text()).get("worker_pids", []) if status.exists() else []
    wait_until(lambda: not any(alive(pid) for pid in pids), "the workers to drain and exit", 40)
    spooled = [
        r for spool in sorted(gw.root.glob("state/workers/w*/spool-*.jsonl")) for r in read_records(spool)
    ]
    return read_records(gw.audit_path) + spooled


@pytest.mark.root
@pytest.mark.parametrize("fsync", ["per_batch", "off"], ids=["per_batch holds answers", "off answers early"])
def test_kill_9_while_the_writer_is_stuck(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, tmp_path: Path, fsync: str
) -> None:
    # The writer cannot write (full disk): with per_batch nothing is answered that is not on
    # disk; with off, answers go out and kill -9 loses their records (the documented window).
    with SmallDisk(tmp_path / "disk", size="1m") as disk:
        audit = disk.path / "audit.jsonl"
        # One process: its own window is the subject (with workers, a killed supervisor's
        # workers outlive it and spool: test_kill_9_with_per_batch_fsync_loses_no_answered_request).
        cfg = {"audit": {"path": str(audit), "fsync": fsync}, "workers": {"count": 1}}
        gw = start_gateway(allow_upstream(http_upstream), config=cfg)
        base = http_upstream.url_for("api.test")
        with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
            assert c.get(f"{base}/before").status_code == 200
        assert len(wait_records(audit, 1)) == 1
        disk.fill()
        answered: list[str] = []

        def one(i: int) -> None:
            try:
                with httpx.Client(proxy=gw.proxy(), timeout=3) as c:
                    if c.get(f"{base}/stuck{i}").status_code == 200:
                        answered.append(f"/stuck{i}")
            except httpx.HTTPError:
                pass

        # More than the audit file's last page can still take (~600 bytes a record).
        clients = [threading.Thread(target=one, args=(i,)) for i in range(20)]
        for t in clients:
            t.start()
        http_upstream.wait_for_requests(21, timeout=20)
        if fsync == "off":
            for t in clients:
                t.join(10)  # answered without waiting for the disk: all of them, before the kill
        else:
            time.sleep(1.0)  # the answers wait for the disk: give them the time to (wrongly) come
        gw.proc.send_signal(signal.SIGKILL)
        gw.proc.wait(10)
        for t in clients:
            t.join(10)
        disk.free()
        recorded = {r["path"] for r in read_records(audit)}
    missing = [p for p in answered if p not in recorded]
    if fsync == "per_batch":
        assert not missing, "nothing is answered before its record is on disk"
        assert len(answered) < 20, "answers wait while the disk is full"
    else:
        assert len(answered) == 20
        assert missing, "off: answered while still queued, lost to kill -9 (the documented window)"
