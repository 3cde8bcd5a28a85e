"""Audit with workers: records/s through ForwardSink → collector → file vs the file sink directly.

Run: `.venv/bin/python bench/audit_forward.py [--records N] [--rounds R] [--json out.json]`.

Rows (each: N decision records, as the gateway builds them, emitted into an `AuditLog` and
timed from the first `emit` until `close()` returns, everything written):

Records are built before the clock starts, so the rows compare the writer's path.

- `file sink, fsync off|per batch`: the AuditLog writes the JSON-lines file itself (one gateway
  process, no workers).
- `forward → collector, fsync off|per batch`: the AuditLog has a `ForwardSink`; the collector
  runs in another process (as in the supervisor) and writes the file; every batch waits for
  its ack (after the write, and the fsync in the per-batch rows).
- `2 workers → collector, fsync off`: two worker processes, N records each, at once; records/s
  is 2N over the wall time from both starting to both done (the collector writes for both).
- `file sink | forward → collector, sink.write of 512-record batches`: encoded batches straight
  into the sink, no AuditLog and no emitting side: the transport's own cost next to the write.
- `round trip, 1 record`: one-record batches written one after another through ForwardSink
  (no AuditLog): p50 and p99 µs per acknowledged batch, what an acknowledged `emit` costs at
  low load beyond the file write.

One machine, noisy (2 shared cores; the worker, the collector and this script share them):
each row is the median of R rounds (3), with every round's figure alongside.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from sandgate.policy.decision import Decision, Identity, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.audit.forward import ForwardSink
from sandgate.proxy.audit.records import DecisionContext, decision_record
from sandgate.proxy.audit.trail import AuditLog, AuditSink, JsonlFileSink

# The supervisor's side: a collector writing `path`; "ready" once it listens, the number of
# records written when stdin closes.
COLLECTOR = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from sandgate.proxy.audit.collector import AuditCollector
    from sandgate.proxy.audit.trail import JsonlFileSink

    sock, path, fsync = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
    collector = AuditCollector(sock, JsonlFileSink(path, max_bytes=1 << 40, backups=1, fsync=fsync))
    collector.start()
    print("ready", flush=True)
    sys.stdin.read()
    collector.close()
    print(collector.written, flush=True)
    """
)

# A worker: N records (built before "ready") through AuditLog + ForwardSink; prints its wall time.
WORKER = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[4])
    from audit_forward import record, timed_emit
    from sandgate.proxy.audit.forward import ForwardSink

    sock, worker, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    records = [record(i) for i in range(n)]
    print("ready", flush=True)
    sys.stdin.readline()
    print(timed_emit([ForwardSink(sock, worker)], records), flush=True)
    """
)


def record(i: int) -> dict[str, Any]:
    """A realistic decision record (a denied HTTPS request)."""
    ctx = DecisionContext(
        phase=Phase.REQUEST,
        listener="regular@127.0.0.1:8080",
        client="127.0.0.1:40000",
        host="api.example.test",
        port=443,
        method="GET",
        path=f"/v1/items/{i}?key=x",
        identity=Identity("t1", "sb1"),
    )
    return decision_record(ctx, Decision(reason=Reason.PATH_NOT_ALLOWED, policy_version="a4c4c1347d42"))


async def _emit_all(audit: AuditLog, records: list[dict[str, Any]]) -> None:
    for r in records:
        if not await audit.emit(r):
            raise RuntimeError("audit queue refused a record")


def timed_emit(sinks: list[AuditSink], records: list[dict[str, Any]]) -> float:
    """Seconds for the records through an AuditLog into `sinks`, until close() returns."""
    n = len(records)
    audit = AuditLog(sinks, queue_size=10_000, log_events=False)
    audit.start()
    started = time.perf_counter()
    asyncio.run(_emit_all(audit, records))
    audit.close(timeout=600)
    wall = time.perf_counter() - started
    if audit.written != n:
        raise RuntimeError(f"{audit.written} of {n} written")
    return wall


class Collector:
    """The collector in its own process, writing `path`."""

    def __init__(self, sock: Path, path: Path, *, fsync: bool) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", COLLECTOR, str(sock), str(path), "1" if fsync else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("collector did not start")

    def stop(self) -> int:
        """Records it wrote."""
        out, _ = self.proc.communicate(timeout=60)
        return int(out.strip())


def _row(name: str, n: int, wall: float) -> dict[str, Any]:
    return {"row": name, "records": n, "seconds": round(wall, 3), "records_per_s": round(n / wall)}


def direct_row(tmp: Path, n: int, *, fsync: bool) -> dict[str, Any]:
    sink = JsonlFileSink(tmp / f"direct-{fsync}.jsonl", max_bytes=1 << 40, backups=1, fsync=fsync)
    wall = timed_emit([sink], [record(i) for i in range(n)])
    return _row(f"file sink, fsync {'per batch' if fsync else 'off'}", n, wall)


def forward_row(tmp: Path, n: int, *, fsync: bool) -> dict[str, Any]:
    sock = tmp / f"fw-{fsync}" / "audit.sock"
    collector = Collector(sock, tmp / f"fw-{fsync}.jsonl", fsync=fsync)
    wall = timed_emit([ForwardSink(sock, "w0")], [record(i) for i in range(n)])
    if (written := collector.stop()) != n:
        raise RuntimeError(f"collector wrote {written} of {n}")
    return _row(f"forward → collector, fsync {'per batch' if fsync else 'off'}", n, wall)


def two_workers_row(tmp: Path, n: int) -> dict[str, Any]:
    sock = tmp / "two" / "audit.sock"
    collector = Collector(sock, tmp / "two.jsonl", fsync=False)
    here = str(Path(__file__).resolve().parent)
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(sock), f"w{i}", str(n), here],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for w in workers:
        assert w.stdout is not None and w.stdout.readline().strip() == "ready"
    started = time.perf_counter()
    for w in workers:
        assert w.stdin is not None
        w.stdin.write("go\n")
        w.stdin.flush()
    for w in workers:
        w.communicate(timeout=600)
    wall = time.perf_counter() - started
    if (written := collector.stop()) != 2 * n:
        raise RuntimeError(f"collector wrote {written} of {2 * n}")
    return _row("2 workers → collector, fsync off", 2 * n, wall)


def batch_rows(tmp: Path, n: int) -> list[dict[str, Any]]:
    """N encoded records in 512-record batches straight into the sink (no AuditLog): what the
    transport costs next to the file write, without the emitting side."""
    line = json.dumps(record(0), separators=(",", ":")) + "\n"
    batches = [[line] * 512 for _ in range(max(1, n // 512))]
    count = 512 * len(batches)
    rows = []
    for name in ("file sink", "forward → collector"):
        collector = None
        if name == "file sink":
            sink: AuditSink = JsonlFileSink(tmp / "batch-direct.jsonl", max_bytes=1 << 40, backups=1)
        else:
            sock = tmp / "batch" / "audit.sock"
            collector = Collector(sock, tmp / "batch-fw.jsonl", fsync=False)
            sink = ForwardSink(sock, "w0")
        started = time.perf_counter()
        for batch in batches:
            sink.write(batch)
        sink.close()
        wall = time.perf_counter() - started
        if collector is not None and (written := collector.stop()) != count:
            raise RuntimeError(f"collector wrote {written} of {count}")
        rows.append(_row(f"{name}, sink.write of 512-record batches, fsync off", count, wall))
    return rows


def round_trip_row(tmp: Path, count: int) -> dict[str, Any]:
    sock = tmp / "rt" / "audit.sock"
    collector = Collector(sock, tmp / "rt.jsonl", fsync=False)
    sink = ForwardSink(sock, "w0")
    line = json.dumps(record(0), separators=(",", ":")) + "\n"
    times = []
    for _ in range(count):
        started = time.perf_counter()
        sink.write([line])
        times.append(time.perf_counter() - started)
    sink.close()
    collector.stop()
    times.sort()
    return {
        "row": "round trip, 1 record",
        "batches": count,
        "p50_us": round(times[len(times) // 2] * 1e6),
        "p99_us": round(times[int(len(times) * 0.99)] * 1e6),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000, help="records per row (100000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each row shows its median (3)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sandgate-bench-audit-forward-"))
    n = args.records
    rows: list[dict[str, Any]] = []
    try:
        # Rounds interleave the rows, so that a burst of load elsewhere hits them alike; each
        # row reports its median round.
        rounds: list[list[dict[str, Any]]] = []
        for r in range(args.rounds):
            run = tmp / f"round{r}"
            run.mkdir()
            found = []
            for fsync in (False, True):
                found.append(direct_row(run, n, fsync=fsync))
                found.append(forward_row(run, n, fsync=fsync))
            found.append(two_workers_row(run, n))
            found.extend(batch_rows(run, n))
            found.append(round_trip_row(run, 5000))
            rounds.append(found)
            shutil.rmtree(run, ignore_errors=True)
        for i in range(len(rounds[0])):
            runs = [found[i] for found in rounds]
            key = "records_per_s" if "records_per_s" in runs[0] else "p50_us"
            median = sorted(runs, key=lambda row: row[key])[len(runs) // 2]
            rows.append({**median, "rounds": [row[key] for row in runs]})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
