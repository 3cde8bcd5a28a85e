"""Audit benchmark: writer throughput to the file and to file + fleet stream, spool replay, big files.

Run: `.venv/bin/python bench/audit.py [--records N] [--size-mb M] [--json out.json]`.

Rows:

- `file only`: N decision records (`decision_record`, as the gateway builds them) emitted into
  an `AuditLog` with the JSON-lines file sink; timed from the first `emit` until `close()`
  returns (everything encoded, written and flushed).
- `file + stream`: the same with the redis stream sink too, against a local `redis-server`
  (no persistence); timed until every record is acknowledged by redis (XADD via the Lua
  add-once script, batches of 256).
- `spool replay`: N records already in the spool (as after an outage); timed from starting
  the replay thread until the spool is empty and truncated.
- `big file`: an M MB audit file (written in a few seconds from repeated lines); `audit stats`
  `audit query` (a selective filter, then `--limit 3`) and `audit tail -n 10`, each in a fresh
  process: wall time and peak RSS (`ru_maxrss`); the first row, `stats` over a 1 MB file, is
  the baseline (interpreter and imports) to compare with (`--size-mb 0` skips them).

- `gateway, fsync off|per_batch, cC`: requests/s through a real `sandgate run` (regular mode,
  plain HTTP, keep-alive, C concurrent connections, bench/loadclient.py) in front of a loopback
  upstream, with `audit.fsync: off` and `per_batch` (each response waits for its record's
  batch to be written and fsynced; the audit file on the state dir's disk under /tmp);
  `--gateway-seconds 0` skips them.

Records/s is N / wall time. Single run, one machine: noisy (2 shared cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from conftest import SANDGATE, TOKEN, UPSTREAM_IP, tenant_yaml, write_gateway_files  # noqa: E402
from support import RecordingUpstream, RedisServer, wait_for_port  # noqa: E402

from sandgate.policy.decision import Decision, Identity, Phase  # noqa: E402
from sandgate.policy.reasons import Reason  # noqa: E402
from sandgate.proxy.audit.records import DecisionContext, decision_record  # noqa: E402
from sandgate.proxy.audit.redis_stream import RedisStreamSink  # noqa: E402
from sandgate.proxy.audit.trail import AuditLog, AuditSink, JsonlFileSink  # noqa: E402
from sandgate.proxy.config import RedisConfig  # noqa: E402
from sandgate.proxy.redis.client import Keys, connect_sync  # noqa: E402


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


def stream_sink(server: RedisServer, spool: Path) -> RedisStreamSink:
    client = connect_sync(RedisConfig(url=server.url))
    return RedisStreamSink(client, Keys("bench:"), spool, maxlen=10_000_000, dedupe_ttl=3600, gateway="bench")


async def _emit_all(audit: AuditLog, n: int) -> None:
    for i in range(n):
        if not await audit.emit(record(i)):
            raise RuntimeError("audit queue refused a record")


def writer_row(name: str, sinks: list[AuditSink], n: int) -> dict[str, Any]:
    """N records through an AuditLog into `sinks`, until close() returns."""
    audit = AuditLog(sinks, queue_size=10_000, log_events=False)
    audit.start()
    started = time.perf_counter()
    asyncio.run(_emit_all(audit, n))
    audit.close(timeout=600)
    wall = time.perf_counter() - started
    if audit.written != n:
        raise RuntimeError(f"{name}: {audit.written} of {n} written")
    return {"row": name, "records": n, "seconds": round(wall, 3), "records_per_s": round(n / wall)}


def replay_row(server: RedisServer, tmp: Path, n: int) -> dict[str, Any]:
    """N records in a spool, replayed into an empty stream."""
    spool = tmp / "replay.spool"
    with spool.open("w") as f:
        for i in range(n):
            f.write(json.dumps(record(i), separators=(",", ":"), default=str) + "\n")
    sink = stream_sink(server, spool)
    started = time.perf_counter()
    sink.start()
    while sink.spooling:
        time.sleep(0.005)
    wall = time.perf_counter() - started
    sink.close()
    if sink.written != n:
        raise RuntimeError(f"replay: {sink.written} of {n} added")
    return {"row": "spool replay", "records": n, "seconds": round(wall, 3), "records_per_s": round(n / wall)}


_MEASURE = """
import contextlib, io, json, resource, sys, time
from sandgate.proxy.cli.main import main
out = io.StringIO()
started = time.perf_counter()
with contextlib.redirect_stdout(out):
    code = main(["audit", *sys.argv[1:]])
print(json.dumps({"code": code, "seconds": time.perf_counter() - started,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "output_lines": len(out.getvalue().splitlines())}))
"""


def big_file_rows(tmp: Path, size_mb: int) -> list[dict[str, Any]]:
    """audit stats/query/tail over a file of `size_mb` MB, each in a fresh process."""
    path = tmp / "big" / "audit.jsonl"
    path.parent.mkdir()
    lines = [json.dumps(record(i), separators=(",", ":"), default=str) + "\n" for i in range(1000)]
    other = lines[0].replace('"tenant":"t1"', '"tenant":"t2"')
    block = ("".join(lines[:999]) + other).encode()
    started = time.perf_counter()
    with path.open("wb") as f:
        for _ in range(max(1, size_mb * 1024 * 1024 // len(block))):
            f.write(block)
    written = time.perf_counter() - started
    size = path.stat().st_size
    small = tmp / "small" / "audit.jsonl"
    small.parent.mkdir()
    small.write_bytes(block)
    rows = []
    for target, argv in [(small, ["stats", "--format", "json"])] + [
        (path, a)
        for a in (
            ["stats", "--format", "json"],
            ["query", "--tenant", "t2", "--limit", "3", "--format", "json"],
            ["query", "--reason", "host_not_allowed", "--format", "json"],
            ["tail", "-n", "10", "--format", "json"],
        )
    ]:
        done = subprocess.run(
            [sys.executable, "-c", _MEASURE, *argv, "--file", str(target)],
            capture_output=True,
            text=True,
            check=True,
        )
        m = json.loads(done.stdout)
        rows.append(
            {
                "row": f"{target.stat().st_size / 1e6:.1f} MB file: audit {' '.join(argv[:3])}",
                "seconds": round(m["seconds"], 2),
                "peak_rss_mib": round(m["peak_rss_mib"], 1),
                "mb_per_s": round(target.stat().st_size / 1e6 / m["seconds"], 1),
            }
        )
    rows.append({"row": f"big file written ({size / 1e6:.0f} MB)", "seconds": round(written, 2)})
    return rows


def gateway_row(
    root: Path, upstream: RecordingUpstream, fsync: str, concurrency: int, seconds: float
) -> dict[str, Any]:
    """Requests/s through a real gateway with `audit.fsync: fsync`."""
    tenants = {"t1.yaml": tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [upstream.port]}])}
    config, port = write_gateway_files(
        root, tenants, config={"log": {"level": "warning"}, "audit": {"fsync": fsync}}
    )
    with open(root / "gateway.log", "wb") as log:
        proc = subprocess.Popen(
            [SANDGATE, "run", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        wait_for_port("127.0.0.1", port, timeout=60)
        out = subprocess.run(
            [
                sys.executable, str(REPO / "bench" / "loadclient.py"),
                "--address", f"127.0.0.1:{port}", "--url", f"http://api.test:{upstream.port}/x",
                "--proxy", "--auth", f"sb1:{TOKEN}", "--concurrency", str(concurrency),
                "--duration", str(seconds), "--warmup", "1",
            ],
            capture_output=True, text=True, timeout=seconds + 60, check=True,
        )  # fmt: skip
        result = json.loads(out.stdout)
    finally:
        proc.terminate()
        proc.wait(30)
    audit = root / "state" / "audit" / "audit.jsonl"
    records = sum(1 for _ in audit.open()) if audit.exists() else 0
    return {
        "row": f"gateway, fsync {fsync}, c{concurrency}",
        "rps": round(result["rps"]),
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "errors": result["errors"],
        "records": records,
    }


def gateway_rows(tmp: Path, seconds: float) -> list[dict[str, Any]]:
    rows = []
    with RecordingUpstream(UPSTREAM_IP, name="bench") as upstream:
        for concurrency in (10, 1):
            for fsync in ("off", "per_batch"):
                upstream.reset()
                root = tmp / f"gw-{fsync}-{concurrency}"
                rows.append(gateway_row(root, upstream, fsync, concurrency, seconds))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000, help="records per writer row (100000)")
    parser.add_argument("--size-mb", type=int, default=1024, help="big-file size in MB (1024; 0 skips)")
    parser.add_argument(
        "--gateway-seconds", type=float, default=5.0, help="load per gateway row (5; 0 skips them)"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sandgate-bench-audit-"))
    server = RedisServer(tmp / "redis")
    rows: list[dict[str, Any]] = []
    try:
        server.start()
        n = args.records
        rows.append(
            writer_row("file only", [JsonlFileSink(tmp / "a.jsonl", max_bytes=1 << 40, backups=1)], n)
        )
        sinks: list[AuditSink] = [
            JsonlFileSink(tmp / "b.jsonl", max_bytes=1 << 40, backups=1),
            stream_sink(server, tmp / "b.spool"),
        ]
        rows.append(writer_row("file + stream", sinks, n))
        rows.append(replay_row(server, tmp, n))
        if args.size_mb:
            rows.extend(big_file_rows(tmp, args.size_mb))
        if args.gateway_seconds:
            rows.extend(gateway_rows(tmp, args.gateway_seconds))
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    print(f"bench peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
