"""The audit trail: a bounded queue in front of a writer thread that never drops a record.

Hooks only build a dict and enqueue it; JSON encoding, file writes, rotation, retries and the
structlog `egress.decision` event all happen on the writer thread. When the queue is full,
`emit` waits (the decision waits with it) up to `max_wait`; past that it reports failure and
the caller denies the connection with `internal_error`, counted and logged. A failing disk
is retried with backoff while records stay queued.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import structlog

from .audit_redis import RedisStreamSink
from .records import format_time, new_decision_id

__all__ = ["AuditLog", "AuditSink", "JsonlFileSink", "StdoutSink"]

log = structlog.get_logger("sandgate.audit")

Record = Mapping[str, Any]


class AuditSink(Protocol):
    """Where encoded records go. `write` raises OSError to have the batch retried."""

    def write(self, lines: list[str]) -> None: ...

    def close(self) -> None: ...


class JsonlFileSink:
    """A JSON-lines file, rotated by size (`audit.jsonl.1` is the newest rotated file)."""

    def __init__(self, path: Path, *, max_bytes: int, backups: int, fsync: bool = False) -> None:
        self.path = path
        self._max_bytes = max_bytes
        self._backups = backups
        self._fsync = fsync
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._file = self._open()

    def _open(self) -> Any:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return os.fdopen(fd, "a", encoding="utf-8", buffering=1024 * 1024)

    def write(self, lines: list[str]) -> None:
        self._file.write("".join(lines))
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
        if self._file.tell() >= self._max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        self._file.close()
        for i in range(self._backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._file = self._open()

    def close(self) -> None:
        self._file.close()


class StdoutSink:
    """Records on standard output, one JSON object per line."""

    def write(self, lines: list[str]) -> None:
        sys.stdout.write("".join(lines))
        sys.stdout.flush()

    def close(self) -> None:
        sys.stdout.flush()


class AuditLog:
    """Accepts records from the event loop; a thread encodes and writes them in order."""

    def __init__(
        self,
        sinks: list[AuditSink],
        *,
        queue_size: int = 10_000,
        max_wait: float = 5.0,
        log_events: bool = True,
    ) -> None:
        self._sinks = sinks
        self._queue: queue.Queue[Record | None] = queue.Queue(maxsize=queue_size)
        self._max_wait = max_wait
        self._log_events = log_events
        self._thread: threading.Thread | None = None
        self.overflow_denials = 0
        self.written = 0
        # The fleet stream's counters (written, spooled, replayed, spool_depth), for metrics.
        self.stream = next((s for s in sinks if isinstance(s, RedisStreamSink)), None)

    def start(self) -> None:
        if self._thread is None:
            for sink in self._sinks:
                start = getattr(sink, "start", None)
                if callable(start):
                    start()  # e.g. the stream sink's replay thread
            self._thread = threading.Thread(target=self._run, name="sandgate-audit", daemon=True)
            self._thread.start()

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    async def emit(self, record: Record) -> bool:
        """Queue a record; wait for room up to max_wait. False means it could not be queued."""
        try:
            self._queue.put_nowait(record)
            return True
        except queue.Full:
            pass
        deadline = time.monotonic() + self._max_wait
        while time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            try:
                self._queue.put_nowait(record)
                return True
            except queue.Full:
                continue
        self.overflow_denials += 1
        log.error("audit.queue_full", denied_total=self.overflow_denials, queue_size=self._queue.maxsize)
        return False

    def emit_nowait(self, record: Record) -> None:
        """Queue a record from outside the hot path (start-up, reload), blocking if full."""
        self._queue.put(record)

    def close(self, timeout: float = 10.0) -> None:
        """Write out everything queued, then stop the thread."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)
        self._thread = None
        for sink in self._sinks:
            sink.close()

    def _run(self) -> None:
        stop = False
        while not stop:
            batch: list[Record] = []
            item = self._queue.get()
            while True:
                if item is None:
                    stop = True
                    break
                batch.append(item)
                if len(batch) >= 512:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._write(batch)

    def _write(self, batch: list[Record]) -> None:
        batch = [_with_time(r) for r in batch]
        lines = [json.dumps(r, separators=(",", ":"), default=str) + "\n" for r in batch]
        for sink in self._sinks:
            delay = 0.05
            while True:
                try:
                    sink.write(lines)
                    break
                except OSError as e:
                    # Never drop: keep the batch and retry; the bounded queue applies back-pressure.
                    log.error(
                        "audit.write_failed",
                        sink=type(sink).__name__,
                        error=e.strerror,
                        retry_in=delay,
                    )
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
        self.written += len(batch)
        if self._log_events:
            for r in batch:
                if r.get("event") == "decision":
                    log.info("egress.decision", **{k: v for k, v in r.items() if k != "event"})


def _with_time(record: Record) -> Record:
    """The record with an epoch `time` rendered as RFC 3339, and an id (the stream dedupes by it)."""
    t = record.get("time")
    if isinstance(t, float):
        record = {**record, "time": format_time(t)}
    if not record.get("decision_id"):
        record = {**record, "decision_id": new_decision_id()}
    return record
