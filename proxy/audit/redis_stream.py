"""The fleet audit stream: records to `<prefix>audit` in redis, spooled on disk while redis is away.

`RedisStreamSink` is an `AuditSink` driven by the AuditLog writer thread (synchronous, off the
event loop). Each record is added once: a Lua script sets `<prefix>audit:seen:<id>` (NX, with
a TTL) and only then XADDs (`MAXLEN ~`), so a batch sent twice (a timeout after redis applied
it, a crash mid-replay) adds nothing the second time. While redis is unreachable, and for as
long as the spool is not empty, records are appended to the spool file (one fsync per batch)
so their order is kept; a replay thread retries with backoff, sends the spool in order when
redis is back, and truncates it once it has caught up. The writer thread waits on redis at
most one timeout per outage: after a failure it only appends to the spool.

The dedupe window is `dedupe_ttl` (each seen key costs redis ~100 bytes for that long): a
spool replayed after a longer gap may repeat at most the batch that was in flight.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
import structlog

from sandgate.proxy.redis.client import Keys
from sandgate.proxy.redis.outage import REDIS_OUTAGE

__all__ = ["RedisStreamSink", "record_id"]

log = structlog.get_logger("sandgate.audit")

# KEYS: the stream, then one seen-key per record; ARGV: maxlen, ttl, gateway, the seen-key
# prefix's length, then the lines (the record id is its seen-key without the prefix).
_ADD_ONCE = """
local added = 0
local skip = tonumber(ARGV[4])
for i = 2, #KEYS do
  -- Marked seen only after the XADD went through: a script is not rolled back, so a failed
  -- XADD (say WRONGTYPE) must leave the record to be sent again, not remembered as sent.
  if redis.call('EXISTS', KEYS[i]) == 0 then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*',
               'id', string.sub(KEYS[i], skip + 1), 'gw', ARGV[3], 'r', ARGV[i + 3])
    redis.call('SET', KEYS[i], '1', 'EX', ARGV[2])
    added = added + 1
  end
end
return added
"""

_ID_IN_LINE = re.compile(r'"decision_id":"([0-9A-Za-z_.:-]{1,128})"')
_FIRST_DELAY, _MAX_DELAY = 0.1, 5.0
_READ_CHUNK = 1 << 20


def record_id(line: str) -> str:
    """The record's decision_id; a line without one is named by its hash (stable across replays)."""
    found = _ID_IN_LINE.search(line)
    if found:
        return found.group(1)
    try:
        value = json.loads(line)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("decision_id"), str) and value["decision_id"]:
        return str(value["decision_id"])
    return "sha256-" + hashlib.sha256(line.encode()).hexdigest()[:32]


class RedisStreamSink:
    """Adds encoded records to the audit stream exactly once, spooling them while redis is away.

    Counters (read by metrics, updated by the writer and replay threads): `written` records the
    stream holds because of this sink (added live or replayed), `duplicates` records it already
    had, `spooled` records appended to the spool, `replayed` records sent from the spool,
    `failures` redis errors seen; `spool_depth` records waiting in the spool.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        spool_path: Path,
        *,
        maxlen: int,
        dedupe_ttl: int,
        gateway: str,
        batch: int = 256,
    ) -> None:
        self._client = client
        self._stream = keys("audit")
        self._seen = keys("audit", "seen", "")
        self._maxlen = maxlen
        self._ttl = dedupe_ttl
        self._gateway = gateway
        self._batch = batch
        self._script = client.register_script(_ADD_ONCE)
        self.spool_path = spool_path
        self.written = self.duplicates = self.spooled = self.replayed = self.failures = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        spool_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fd = os.open(spool_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        self._offset = 0  # where the replay continues; the spool's bytes before it are in redis
        self._depth = self._recover()
        self._spooling = self._depth > 0

    @property
    def stream_key(self) -> str:
        return self._stream

    @property
    def spool_depth(self) -> int:
        """Records in the spool not yet in redis."""
        return self._depth

    @property
    def spooling(self) -> bool:
        """Whether new records go to the spool (redis away, or the spool still being replayed)."""
        return self._spooling

    def start(self) -> None:
        """Start the replay thread (it replays a spool left by an earlier run first)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._replay_loop, name="sandgate-audit-replay", daemon=True
            )
            self._thread.start()
            self._wake.set()

    def write(self, lines: list[str]) -> None:
        """Add the records to the stream, or to the spool; raises OSError only when the spool fails."""
        with self._lock:
            if self._spooling:
                self._append(lines)
                return
        # Only this (writer) thread turns spooling on, so the spool is empty here.
        sent = 0
        try:
            for start in range(0, len(lines), self._batch):
                chunk = lines[start : start + self._batch]
                self._send(chunk)
                sent += len(chunk)
        except Exception as e:  # any fault: spool, never lose the batch or kill the writer thread
            self.failures += 1
            log.warning("audit.stream_unavailable", error=type(e).__name__, spooling=len(lines) - sent)
            with self._lock:
                self._append(lines[sent:])
                self._spooling = True
            self._wake.set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop replaying; what is left in the spool is replayed by the next run."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._lock:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)  # each append is fsynced already; this is the last word
            os.close(self._fd)
            self._fd = -1
        self._client.close()

    # -- redis -------------------------------------------------------------------------------

    def _send(self, lines: Sequence[str]) -> None:
        """Add lines not seen before, in order, in one script call."""
        ids = [record_id(line) for line in lines]
        args: list[Any] = [self._maxlen, self._ttl, self._gateway, len(self._seen.encode())]
        args += [line.rstrip("\n") for line in lines]
        with REDIS_OUTAGE.track("audit_stream"):
            added = int(self._script(keys=[self._stream, *(self._seen + i for i in ids)], args=args))
        self.written += added
        self.duplicates += len(lines) - added

    # -- the spool ---------------------------------------------------------------------------

    def _append(self, lines: list[str]) -> None:
        """Append lines to the spool and fsync; on failure leave the spool as it was (lock held)."""
        if not lines:
            return
        data = "".join(lines).encode()
        size = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, data)
            while written < len(data):
                written += os.write(self._fd, data[written:])
            os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, size)  # no torn line for the retry to duplicate
            raise
        self.spooled += len(lines)
        self._depth += len(lines)

    def _recover(self) -> int:
        """Records in a spool left by an earlier run (a torn last line from a crash is cut off)."""
        count, size, last_end = 0, 0, 0
        with open(self._fd, "rb", closefd=False) as f:
            while chunk := f.read(_READ_CHUNK):
                newlines = chunk.count(b"\n")
                if newlines:
                    last_end = size + chunk.rfind(b"\n") + 1
                count += newlines
                size += len(chunk)
        if last_end < size:
            log.error("audit.spool_torn_tail", path=str(self.spool_path), bytes=size - last_end)
            os.ftruncate(self._fd, last_end)
        if count:
            log.info("audit.spool_found", path=str(self.spool_path), records=count)
        return count

    def _next_lines(self) -> tuple[list[str], int]:
        """Up to one batch of complete lines after the replay offset, and the bytes they span."""
        size = _READ_CHUNK
        while True:
            with self._lock:
                data = os.pread(self._fd, size, self._offset)
            end = data.rfind(b"\n") + 1
            if end or len(data) < size:
                break
            size *= 2  # one record longer than the window: read further
        # Split and count in bytes, so the offset stays on a line boundary whatever the bytes.
        raw = data[:end].split(b"\n")[:-1][: self._batch]
        return [line.decode(errors="replace") + "\n" for line in raw], sum(len(line) + 1 for line in raw)

    def _replay_some(self) -> bool:
        """Send the next batch of the spool; True once it is empty and truncated."""
        lines, span = self._next_lines()
        if lines:
            self._send(lines)
            with self._lock:
                self._offset += span
                self._depth -= len(lines)
                self.replayed += len(lines)
            return False
        with self._lock:
            appended = os.fstat(self._fd).st_size > self._offset
        if appended:
            self._stop.wait(_FIRST_DELAY)  # a line still being written: no busy loop
            return False
        with self._lock:
            if os.fstat(self._fd).st_size > self._offset:
                return False
            os.ftruncate(self._fd, 0)
            self._offset = 0
            self._depth = 0
            self._spooling = False
        log.info("audit.spool_replayed", replayed_total=self.replayed)
        return True

    def _replay_loop(self) -> None:
        delay = _FIRST_DELAY
        while not self._stop.is_set():
            if not self._spooling:
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                self._replay_some()
                delay = _FIRST_DELAY
            except (redis.RedisError, OSError) as e:
                self.failures += 1
                log.warning(
                    "audit.replay_failed", error=type(e).__name__, retry_in=delay, spooled=self._depth
                )
                self._stop.wait(delay)
                delay = min(delay * 2, _MAX_DELAY)
            except Exception:
                # Never let the thread die: the spool would grow for ever.
                log.exception("audit.replay_crashed")
                self._stop.wait(_MAX_DELAY)
