"""Cost of the audit hash chain and signed checkpoints per record.

Run: `.venv/bin/python bench/audit_chain.py [--records N] [--repeat R] [--json out.json]`.

Rows (best of R runs each, the file under a fresh temporary folder):

- `sink, plain` / `sink, chained`: N encoded decision records written to a `JsonlFileSink` in
  the writer's batches of 512, without and with the chain (a `prev` per line, one SHA-256
  per line, an Ed25519-signed checkpoint every 1000 records): the chain's own cost.
- `writer, plain` / `writer, chained`: the same N records emitted into an `AuditLog` (what
  the gateway does: queue, encode on the writer thread, write) until `close()` returns.

Reported: records/s, µs per record, and the chained/plain ratio of each pair.

With `--verify N`: a chained trail of N records (rotated every 64 MiB, as a gateway's would
be with `audit.max_bytes` at its default of 100 MiB, closer) is written once, then
`sandgate audit verify`'s walk (`verify_trail`) is timed over it, best of R.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from audit import _emit_all, record  # noqa: E402

from sandgate.proxy.audit.chain import Chain, ChainState, load_or_create_key  # noqa: E402
from sandgate.proxy.audit.files import audit_files  # noqa: E402
from sandgate.proxy.audit.trail import AuditLog, JsonlFileSink  # noqa: E402
from sandgate.proxy.audit.verify import verify_trail  # noqa: E402

BATCH = 512


def _sink(folder: Path, chained: bool) -> JsonlFileSink:
    factory: Callable[[ChainState], Chain] | None = None
    if chained:
        key = load_or_create_key(folder / "ca")
        factory = lambda state: Chain(key, state)  # noqa: E731
    return JsonlFileSink(folder / "audit.jsonl", max_bytes=1 << 40, backups=1, chain=factory)


def sink_seconds(lines: list[str], chained: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        sink = _sink(Path(tmp), chained)
        started = time.perf_counter()
        for i in range(0, len(lines), BATCH):
            sink.write(lines[i : i + BATCH])
        sink.close()
        return time.perf_counter() - started


def writer_seconds(n: int, chained: bool) -> float:
    import asyncio

    with tempfile.TemporaryDirectory() as tmp:
        audit = AuditLog([_sink(Path(tmp), chained)], queue_size=10_000, log_events=False)
        audit.start()
        started = time.perf_counter()
        asyncio.run(_emit_all(audit, n))
        audit.close(timeout=600)
        return time.perf_counter() - started


def verify_rows(n: int, repeat: int) -> list[dict[str, Any]]:
    """Write a chained trail of `n` records once, then time verifying it (best of `repeat`)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        key = load_or_create_key(folder / "ca")
        sink = JsonlFileSink(
            folder / "audit.jsonl", max_bytes=64 << 20, backups=1000, chain=lambda state: Chain(key, state)
        )
        for start in range(0, n, BATCH):
            batch = range(start, min(start + BATCH, n))
            sink.write([json.dumps(record(i), separators=(",", ":"), default=str) + "\n" for i in batch])
        sink.close()
        files = list(reversed(audit_files(folder / "audit.jsonl")))  # oldest first
        size = sum(f.stat().st_size for f in files)
        best = float("inf")
        for _ in range(repeat):
            started = time.perf_counter()
            verdict = verify_trail(files, key.public_key())
            best = min(best, time.perf_counter() - started)
            assert verdict.ok, verdict
        row = _row("verify an untouched trail", n, best)
        row.update(files=len(files), mb=round(size / 1e6), seconds=round(best, 1))
        return [row]


def _row(name: str, n: int, seconds: float) -> dict[str, Any]:
    return {
        "row": name,
        "records": n,
        "records_per_s": round(n / seconds),
        "us_per_record": round(1e6 * seconds / n, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--verify", type=int, metavar="N", help="time verifying a trail of N records instead")
    args = parser.parse_args()
    if args.verify:
        for row in verify_rows(args.verify, args.repeat):
            print(json.dumps(row))
        return 0
    n = args.records
    lines = [json.dumps(record(i), separators=(",", ":"), default=str) + "\n" for i in range(n)]
    rows = []
    for kind, run in (("sink", lambda c: sink_seconds(lines, c)), ("writer", lambda c: writer_seconds(n, c))):
        plain = min(run(False) for _ in range(args.repeat))
        chained = min(run(True) for _ in range(args.repeat))
        rows += [_row(f"{kind}, plain", n, plain), _row(f"{kind}, chained", n, chained)]
        rows.append({"row": f"{kind}, chained/plain time", "ratio": round(chained / plain, 2)})
        rows.append({"row": f"{kind}, added per record", "us": round(1e6 * (chained - plain) / n, 2)})
    for row in rows:
        print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
