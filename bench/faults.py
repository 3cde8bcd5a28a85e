"""Fault injection, end to end: what the audit trail and the policy promise under faults.

Each scenario runs real `sandgate run` gateways on loopback in front of a recording upstream
(127.0.0.2), sends bounded load through them (every request to its own path, so responses
and records can be matched), injects one fault, and counts:

- sent: requests sent; answered: responses the clients got (any status);
- records: decision records of those requests (phase `request`);
- missing: answered requests with no record; duplicated: requests with more than one;
- half_read: decisions taken on a policy version that never existed on disk as a whole;
- overshoot: requests admitted beyond the stated bound (limits during a redis outage).

Scenarios: `sigterm` (SIGTERM under load: drain), `kill9` (kill -9 with `audit.fsync:
per_batch`), `disk_full` (the audit disk fills, then frees: tmpfs, needs root),
`redis_outage` (the fleet stream's redis stops answering for 3 s, then answers again:
spool replay),
`rewrite` (a tenant file rewritten in place with pauses mid-file), `limit_outage` (two
gateways sharing a limit lose redis); with two workers and a 1 s upstream: `worker_kill9`
(SIGKILL one worker), `supervisor_kill9` (SIGKILL the supervisor, start again once its workers
drained), `supervisor_kill9_restart` (start again at once, while they drain), `sigterm_held`
(SIGTERM with requests held for an operator). Those also count `at_upstream` (requests the
upstream saw) and `upstream_unrecorded` (of those, without a record). Target: 0 missing, 0
duplicated, 0 upstream_unrecorded, 0 half-read, 0 overshoot in every scenario.

Run: `sudo .venv/bin/python bench/faults.py [--scenario NAME ...] [--requests 300]`. Prints a
table and, with `--json`, one JSON object. Everything stays on loopback and stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from conftest import SANDGATE, TOKEN, TOKEN_REF, UPSTREAM_IP, tenant_yaml, write_gateway_files  # noqa: E402
from support import RecordingUpstream, RedisServer, SmallDisk, wait_for_port  # noqa: E402

from sandgate.policy.model.loader import load_policy_dir  # noqa: E402


@dataclass
class Gateway:
    root: Path
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def audit(self) -> Path:
        return self.root / "state" / "audit" / "audit.jsonl"

    def proxy(self) -> str:
        return f"http://sb1:{TOKEN}@127.0.0.1:{self.port}"

    def records(self) -> list[dict[str, Any]]:
        out = []
        if self.audit.exists():
            for line in self.audit.read_text(errors="replace").splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    out.append({"event": "torn line"})
        return out

    def stop(self, sig: int = signal.SIGTERM, wait: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start(root: Path, tenants: dict[str, str], config: dict[str, Any] | None = None) -> Gateway:
    cfg = {"log": {"level": "warning", "format": "json"}, **(config or {})}
    path, port = write_gateway_files(root, tenants, config=cfg)
    with (root / "gateway.log").open("wb") as log:
        proc = subprocess.Popen(
            [SANDGATE, "run", "--config", str(path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    wait_for_port("127.0.0.1", port, timeout=60)
    return Gateway(root, port, proc)


@dataclass
class Outcome:
    """What the clients saw: path → status (None: no response)."""

    statuses: dict[str, int | None] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answered(self) -> set[str]:
        return {p for p, s in self.statuses.items() if s is not None}


def fire(
    gw: Gateway, upstream: RecordingUpstream, name: str, count: int, outcome: Outcome, pace: float
) -> None:
    """Send `count` requests from 8 clients, each to its own path, about `pace` seconds apart."""

    def one(i: int) -> None:
        path = f"/f/{name}/{i}"
        try:
            with httpx.Client(proxy=gw.proxy(), timeout=15) as c:
                status: int | None = c.get(f"http://api.test:{upstream.port}{path}").status_code
        except httpx.HTTPError:
            status = None
        with outcome.lock:
            outcome.statuses[path] = status

    with ThreadPoolExecutor(8) as pool:
        for i in range(count):
            pool.submit(one, i)
            time.sleep(pace)


def tally(
    name: str,
    sent: int,
    outcome: Outcome,
    records: list[dict[str, Any]],
    upstream: RecordingUpstream | None = None,
) -> dict[str, Any]:
    """Match answered requests (and, with `upstream`, the requests it saw) to their decision
    records by path. A held request's `ask` record is its first, not a second decision."""
    per_path = Counter(
        r["path"]
        for r in records
        if r.get("event") == "decision" and r.get("phase") == "request" and r.get("decision") != "ask"
    )
    answered = outcome.answered()
    row = {
        "scenario": name,
        "sent": sent,
        "answered": len(answered),
        "records": sum(per_path[p] for p in outcome.statuses),
        "missing": sum(1 for p in answered if per_path[p] == 0),
        "duplicated": sum(1 for p in outcome.statuses if per_path[p] > 1),
        "torn_lines": sum(1 for r in records if r.get("event") == "torn line"),
    }
    if upstream is not None:
        seen = [r.target for r in upstream.requests]
        row["at_upstream"] = len(seen)
        row["upstream_unrecorded"] = sum(1 for p in seen if per_path[p] == 0)
    return row


def allow_all(upstream: RecordingUpstream) -> dict[str, str]:
    return {"t1.yaml": tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [upstream.port]}])}


def wait_answered(outcome: Outcome, count: int, timeout: float = 60.0) -> None:
    """Wait until the clients got `count` answers (the fault then hits a gateway under load)."""
    deadline = time.monotonic() + timeout
    while len(outcome.answered()) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def in_background(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


# --- scenarios --------------------------------------------------------------------------


def sigterm(tmp: Path, upstream: RecordingUpstream, n: int) -> dict[str, Any]:
    gw = start(tmp / "sigterm", allow_all(upstream))
    outcome = Outcome()
    load = in_background(lambda: fire(gw, upstream, "sigterm", n, outcome, 0.005))
    wait_answered(outcome, n // 3)
    gw.stop(signal.SIGTERM)
    load.join(60)
    row = tally("sigterm", n, outcome, gw.records())
    row["exit_code"] = gw.proc.returncode
    return row


def kill9(tmp: Path, upstream: RecordingUpstream, n: int) -> dict[str, Any]:
    gw = start(tmp / "kill9", allow_all(upstream), {"audit": {"fsync": "per_batch"}})
    outcome = Outcome()
    load = in_background(lambda: fire(gw, upstream, "kill9", n, outcome, 0.005))
    wait_answered(outcome, n // 3)
    gw.stop(signal.SIGKILL)
    load.join(60)
    return tally("kill9 (fsync per_batch)", n, outcome, gw.records())


def disk_full(tmp: Path, upstream: RecordingUpstream, n: int) -> dict[str, Any]:
    root = tmp / "disk_full"
    with SmallDisk(root / "state" / "audit", "4m") as disk:
        gw = start(root, allow_all(upstream), {"audit": {"max_wait_seconds": 10.0}})
        outcome = Outcome()
        load = in_background(lambda: fire(gw, upstream, "disk_full", n, outcome, 0.01))
        time.sleep(n * 0.01 / 3)
        disk.fill()
        time.sleep(2.0)
        disk.free()
        load.join(120)
        time.sleep(1.0)
        records = gw.records()
        gw.stop()
    return tally("disk_full", n, outcome, records)


def redis_outage(tmp: Path, upstream: RecordingUpstream, n: int) -> dict[str, Any]:
    server = RedisServer(tmp / "redis").start()
    try:
        gw = start(tmp / "redis_outage", allow_all(upstream), {"redis": {"url": server.url, "prefix": "f:"}})
        outcome = Outcome()
        load = in_background(lambda: fire(gw, upstream, "redis_outage", n, outcome, 0.01))
        wait_answered(outcome, n // 4)
        # Unreachable (stopped, as a partitioned host looks), then back with its data: what
        # the gateway spooled meanwhile is replayed behind what redis already had.
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        time.sleep(3.0)
        server.process.send_signal(signal.SIGCONT)
        load.join(120)
        client = redis.Redis.from_url(server.url)
        deadline = time.monotonic() + 30
        records = gw.records()
        wanted = {r["decision_id"] for r in records if r.get("event") == "decision"}
        while True:
            entries = client.xrange("f:audit")
            ids = Counter(e[1][b"id"].decode() for e in entries)
            if wanted <= set(ids) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        client.close()
        gw.stop()
    finally:
        server.stop()
    row = tally("redis_outage (file)", n, outcome, records)
    row["stream_missing"] = len(wanted - set(ids))
    row["stream_duplicated"] = sum(1 for c in ids.values() if c > 1)
    return row


def rewrite(tmp: Path, upstream: RecordingUpstream, n: int) -> dict[str, Any]:
    allow = [{"hosts": ["api.test"], "ports": [upstream.port]}]
    deny = [{"hosts": ["api.test"], "paths": ["/f/rewrite/secret/**"]}]

    def variant(k: int) -> tuple[str, str]:
        return tenant_yaml("t1", allow) + f"# rewrite {k}\n", yaml.safe_dump({"deny": deny})

    gw = start(
        tmp / "rewrite",
        {"t1.yaml": tenant_yaml("t1", allow, deny=deny)},
        {"reload": {"interval_seconds": 0.1, "settle_seconds": 1.0}},
    )
    rules = gw.root / "rules"
    whole = tmp / "rewrite-whole"
    shutil.copytree(rules, whole)
    versions = {load_policy_dir(whole, isolate=True).version}
    rewrites = 8
    for k in range(1, rewrites + 1):
        head, tail = variant(k)
        (whole / "tenants" / "t1.yaml").write_text(head + tail)
        versions.add(load_policy_dir(whole, isolate=True).version)
    outcome = Outcome()
    stop = threading.Event()
    secret_ok = Counter[int]()

    def secret_traffic() -> None:
        with httpx.Client(proxy=gw.proxy(), timeout=15) as c:
            while not stop.is_set():
                secret_ok[c.get(f"http://api.test:{upstream.port}/f/rewrite/secret/x").status_code] += 1

    prober = in_background(secret_traffic)
    load = in_background(lambda: fire(gw, upstream, "rewrite", n, outcome, 0.02))
    rng = random.Random(1)
    path = rules / "tenants" / "t1.yaml"
    for k in range(1, rewrites + 1):
        head, tail = variant(k)
        with path.open("w") as f:
            f.write(head)
            f.flush()
            time.sleep(rng.uniform(0.1, 0.5))
            f.write(tail)
        time.sleep(rng.uniform(0.2, 0.6))
    load.join(120)
    time.sleep(1.5)
    stop.set()
    prober.join(30)
    records = gw.records()
    gw.stop()
    row = tally("rewrite in place", n, outcome, records)
    decisions = [r for r in records if r.get("event") == "decision"]
    row["half_read"] = sum(1 for r in decisions if r["policy_version"] not in versions)
    row["denied_path_allowed"] = secret_ok[200]
    return row


def limit_outage(tmp: Path, upstream: RecordingUpstream, n: int) -> dict[str, Any]:
    """Two gateways share requests_per_minute=L; redis dies after a quarter of L is used."""
    limit = 40
    doc = yaml.safe_load(tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [upstream.port]}]))
    doc["limits"] = {"requests_per_minute": limit}
    tenants = {"t1.yaml": yaml.safe_dump(doc)}
    server = RedisServer(tmp / "redis-limits").start()
    try:
        gws = [
            start(
                tmp / f"limits-{name}",
                tenants,
                {"redis": {"url": server.url, "gateway_id": name}, "limits": {"sync_interval_seconds": 0.05}},
            )
            for name in ("a", "b")
        ]
        time.sleep(2.5)  # both mark themselves alive and see each other
        admitted = 0
        for gw in gws:
            with httpx.Client(proxy=gw.proxy(), timeout=15) as c:
                admitted += sum(
                    c.get(f"http://api.test:{upstream.port}/f/limits/pre{i}").status_code == 200
                    for i in range(limit // 8)
                )
        time.sleep(1.5)  # every gateway learns the fleet total
        server.kill()
        time.sleep(0.5)
        for gw in gws:
            with httpx.Client(proxy=gw.proxy(), timeout=15) as c:
                admitted += sum(
                    c.get(f"http://api.test:{upstream.port}/f/limits/out{i}").status_code == 200
                    for i in range(limit)
                )
        for gw in gws:
            gw.stop()
    finally:
        server.stop()
    return {"scenario": "limit_outage (2 gateways)", "sent": 2 * (limit // 8 + limit), "limit": limit,
            "admitted": admitted, "overshoot": max(0, admitted - limit)}  # fmt: skip


# --- process deaths with two workers ------------------------------------------------------

TWO_WORKERS = {"workers": {"count": 2}}


def worker_pids(gw: Gateway, timeout: float = 90.0) -> list[int]:
    """The workers' pids once the supervisor says every one serves."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = json.loads((gw.root / "state" / "gateway.json").read_text())
            if status.get("workers") == 2:
                return list(status["worker_pids"])
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise RuntimeError("the workers did not all serve")


def gone(pids: list[int], timeout: float) -> None:
    """Wait until none of `pids` runs (reaped or a zombie)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1]
            except OSError:
                continue
            if state != "Z":
                alive.append(pid)
        if not alive:
            return
        time.sleep(0.05)


def restart(gw: Gateway) -> Gateway:
    """The same gateway (folder, config, port) started again."""
    with (gw.root / "gateway-again.log").open("ab") as log:
        proc = subprocess.Popen(
            [SANDGATE, "run", "--config", str(gw.root / "sandgate.yaml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    wait_for_port("127.0.0.1", gw.port, timeout=90)
    return Gateway(gw.root, gw.port, proc)


@contextmanager
def slow(upstream: RecordingUpstream, seconds: float) -> Iterator[None]:
    upstream.delay = seconds
    try:
        yield
    finally:
        upstream.delay = 0.0


def worker_kill9(tmp: Path, upstream: RecordingUpstream, n: int) -> dict[str, Any]:
    """SIGKILL one of two workers while requests wait at a 1 s upstream (fsync off)."""
    gw = start(tmp / "worker_kill9", allow_all(upstream), TWO_WORKERS)
    victim = worker_pids(gw)[1]
    outcome = Outcome()
    with slow(upstream, 1.0):
        load = in_background(lambda: fire(gw, upstream, "worker_kill9", n, outcome, 0.01))
        upstream.wait_for_requests(n // 3, timeout=60)
        os.kill(victim, signal.SIGKILL)
        load.join(120)
    time.sleep(2.5)  # the supervisor settles the dead worker's intents
    gw.stop()
    return tally("worker_kill9 (2 workers)", n, outcome, gw.records(), upstream)


def supervisor_kill9(tmp: Path, upstream: RecordingUpstream, n: int, *, at_once: bool) -> dict[str, Any]:
    """SIGKILL the supervisor with requests at a 1 s upstream; start the gateway again at once
    (while the old workers drain) or once they are gone."""
    name = "supervisor_kill9_restart" if at_once else "supervisor_kill9"
    gw = start(tmp / name, allow_all(upstream), TWO_WORKERS)
    pids = worker_pids(gw)
    outcome = Outcome()
    with slow(upstream, 1.0):
        # Paced over ~10 s: the load goes on across the death and the restart.
        load = in_background(lambda: fire(gw, upstream, name, n, outcome, 0.05))
        upstream.wait_for_requests(n // 4, timeout=60)
        gw.stop(signal.SIGKILL)
        again = restart(gw) if at_once else None
        load.join(120)
        gone(pids, 60)
    spooled = sum(1 for p in (gw.root / "state" / "workers").glob("w*/spool-*.jsonl"))
    again = again or restart(gw)
    worker_pids(again)
    time.sleep(2.5)  # merged at start, and every 2 s for old workers that were still draining
    again.stop()
    row = tally(f"{name} (2 workers)", n, outcome, again.records(), upstream)
    row["spools_left_by_old_workers"] = spooled
    return row


def supervisor_kill9_then_restart(tmp: Path, upstream: RecordingUpstream, n: int) -> dict[str, Any]:
    return supervisor_kill9(tmp, upstream, n, at_once=False)


def supervisor_kill9_restart_at_once(tmp: Path, upstream: RecordingUpstream, n: int) -> dict[str, Any]:
    return supervisor_kill9(tmp, upstream, n, at_once=True)


def sigterm_held(tmp: Path, upstream: RecordingUpstream, n: int) -> dict[str, Any]:
    """SIGTERM (drain 60 s) while requests are held for an operator: answered at once."""
    held = min(n, 8)  # fire() sends from 8 clients: each holds one
    tenant = yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
            "ask": [{"hosts": ["api.test"], "ports": [upstream.port]}],
        }
    )
    cfg = {**TWO_WORKERS, "approvals": {"max_held_per_sandbox": held}, "shutdown": {"drain_seconds": 60}}
    gw = start(tmp / "sigterm_held", {"t1.yaml": tenant}, cfg)
    worker_pids(gw)
    outcome = Outcome()
    load = in_background(lambda: fire(gw, upstream, "sigterm_held", held, outcome, 0.0))
    deadline = time.monotonic() + 30
    while sum(1 for r in gw.records() if r.get("decision") == "ask") < held and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    gw.stop(signal.SIGTERM, wait=90)
    load.join(90)
    row = tally("sigterm_held (2 workers)", held, outcome, gw.records(), upstream)
    row["seconds_to_exit"] = round(time.monotonic() - started, 2)
    row["answered_503"] = sum(1 for s in outcome.statuses.values() if s == 503)
    return row


SCENARIOS: dict[str, Callable[[Path, RecordingUpstream, int], dict[str, Any]]] = {
    "worker_kill9": worker_kill9,
    "supervisor_kill9": supervisor_kill9_then_restart,
    "supervisor_kill9_restart": supervisor_kill9_restart_at_once,
    "sigterm_held": sigterm_held,
    "sigterm": sigterm,
    "kill9": kill9,
    "disk_full": disk_full,
    "redis_outage": redis_outage,
    "rewrite": rewrite,
    "limit_outage": limit_outage,
}


@contextmanager
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sandgate-faults-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with workdir() as tmp, RecordingUpstream(UPSTREAM_IP, name="faults") as upstream:
        for name in args.scenario or list(SCENARIOS):
            upstream.reset()
            rows.append(SCENARIOS[name](tmp, upstream, args.requests))
            print(json.dumps(rows[-1]), file=sys.stderr)
    if args.json:
        print(json.dumps({"scenarios": rows}, indent=2))
        return 0
    columns = [
        "scenario",
        "sent",
        "answered",
        "records",
        "missing",
        "duplicated",
        "at_upstream",
        "upstream_unrecorded",
        "half_read",
        "overshoot",
    ]
    print("| " + " | ".join(columns) + " | other |")
    print("|" + "---|" * (len(columns) + 1))
    for row in rows:
        other = {k: v for k, v in row.items() if k not in columns}
        print("| " + " | ".join(str(row.get(c, "–")) for c in columns) + f" | {other or ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
