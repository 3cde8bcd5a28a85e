"""The audit trail: a bounded queue in front of a writer thread that never drops a record.

Hooks only build a dict and queue it; file writes, rotation, retries, the structlog
`egress.decision` event and JSON encoding happen on the writer thread (but for a record
journaled before it is queued, which is encoded once, on the loop, for both).

Every record needs a place in the queue (`queue_size` places; the batch the writer holds is
out of it). `emit` waits for one up to `max_wait`; past that it returns False and the caller
denies with `internal_error`. `reserve(decision_id)` takes a place ahead for a record that is
written later (an allowed request's record, completed with status and bytes when it ends):
nothing goes upstream without a place for its record, and that record never waits. A record
that finds no place is counted in `unrecorded` (its request is denied all the same) and
logged as `audit.unrecorded`, at most once a second.

With `acknowledge` (`audit.fsync: per_batch`), `emit` returns only once the writer has written
and fsynced the batch holding the record (group commit: one fsync per batch), so a response
released after its record's `emit` is on disk. A failing disk is retried with backoff while
records stay queued; a retry writes each record exactly once (see JsonlFileSink.write).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from sandgate.proxy.audit.chain import Chain, ChainState, load_or_create_key, recover_state
from sandgate.proxy.audit.intents import IntentJournal, trail_line
from sandgate.proxy.audit.records import format_time, new_decision_id
from sandgate.proxy.audit.redis_stream import RedisStreamSink
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.errors import ConfigError

__all__ = ["AuditLog", "AuditSink", "JsonlFileSink", "StdoutSink", "audit_file_sink"]

log = structlog.get_logger("sandgate.audit")

Record = Mapping[str, Any]
ChainFactory = Callable[[ChainState], Chain]

_BATCH = 512
# Without acknowledgement, a writer that wrote in the last _BUSY seconds looks for records
# every _POLL_WRITER seconds instead of being woken for each: one wake-up (a GIL hand-off and
# a write) per few milliseconds of records, not a `notify` (a futex wake the event loop paid
# for, the loop's costliest frame) per record. Idle for _BUSY, it sleeps until notified.
_POLL_WRITER = 0.005
_BUSY = 1.0
_POLL = 0.005  # how often a decision waiting for a place looks again
# Decisions whose record lets traffic go: journaled before they are queued.
_LETS_GO = frozenset({"allow", "would_deny"})
# A record's intent as journaled first, and the one it replaced (None: there was none).
type _Undo = tuple[bytes, bytes | None]
_LOG_EVERY = 1.0  # seconds between two `audit.unrecorded` lines
_FAILED_IDS = 4096  # decision ids remembered as unrecordable (so a denial does not wait twice)


class AuditSink(Protocol):
    """Where encoded records go. `write` raises OSError to have the batch retried; a retry
    must not repeat what an earlier failed attempt already wrote."""

    def write(self, lines: list[str]) -> None: ...

    def close(self) -> None: ...


class JsonlFileSink:
    """A JSON-lines file, rotated by size (`audit.jsonl.1` is the newest rotated file).

    Written with `os.write` on a raw descriptor (no Python buffer to keep a failed write's
    bytes): a batch either reaches the file whole or is cut back to the last whole batch, so
    the writer's retry after ENOSPC (even after a partial write) adds each record once.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int,
        backups: int,
        fsync: bool = False,
        chain: ChainFactory | None = None,
    ) -> None:
        self.path = path
        self._max_bytes = max_bytes
        self._backups = backups
        self._fsync = fsync
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fd = self._open()
        self._size = self._cut_torn_tail()  # bytes of whole records: where the next batch starts
        self._torn = False  # a failed write may have left bytes after _size
        # The hash chain (sandgate.proxy.audit.chain), continued from the trail's end.
        self._chain = chain(recover_state(path)) if chain is not None else None
        self._lock = threading.Lock()  # write, tick (the checkpoint timer) and close
        self._stop_ticks = threading.Event()
        if self._chain is not None and self._chain.seconds > 0:
            threading.Thread(target=self._ticks, name="sandgate-audit-checkpoint", daemon=True).start()

    def _ticks(self) -> None:
        """A checkpoint for records written, also when no record follows them for a while."""
        assert self._chain is not None
        while not self._stop_ticks.wait(self._chain.seconds / 4):
            try:
                self.tick()
            except OSError as e:
                log.error("audit.checkpoint_failed", error=e.strerror)  # tried again at the next tick

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _cut_torn_tail(self) -> int:
        """The file's size after cutting a last line a crash left half-written."""
        size = os.fstat(self._fd).st_size
        if size == 0:
            return 0
        with open(self.path, "rb") as f:
            end = size
            while end > 0:
                start = max(0, end - 65536)
                f.seek(start)
                chunk = f.read(end - start)
                if end == size and chunk.endswith(b"\n"):
                    return size
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    end = start + nl + 1
                    break
                end = start
        log.error("audit.torn_tail", path=str(self.path), bytes=size - end)
        os.ftruncate(self._fd, end)
        return end

    def write(self, lines: list[str]) -> None:
        with self._lock:
            self._append(lines)

    def tick(self) -> None:
        """Write a checkpoint when one is due by time (records were written since the last)."""
        with self._lock:
            if self._chain is not None and self._chain.state.since and self._fd >= 0:
                self._append([])

    def _append(self, lines: list[str], *, final: bool = False) -> None:
        pending: ChainState | None = None
        if self._chain is not None:
            data, pending = self._chain.link(lines, final=final)
            if not data:
                return
        else:
            data = "".join(lines).encode()
        if self._torn:
            os.ftruncate(self._fd, self._size)
            self._torn = False
        try:
            view = memoryview(data)
            done = 0
            while done < len(data):
                done += os.write(self._fd, view[done:])
            if self._fsync:
                os.fsync(self._fd)
        except OSError:
            # Cut the partial batch now (freeing its space), or before the next attempt.
            self._torn = True
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
                self._torn = False
            raise
        if pending is not None and self._chain is not None:
            self._chain.commit(pending)
        self._size += len(data)
        if self._size >= self._max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        os.close(self._fd)
        for i in range(self._backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._fd = self._open()
        self._size = 0

    def close(self) -> None:
        """Write a last checkpoint, flush to disk (fsync) and close."""
        self._stop_ticks.set()
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._fd < 0:
            return
        if self._chain is not None and self._chain.state.since:
            try:
                self._append([], final=True)
            except OSError as e:
                log.error("audit.checkpoint_failed", error=e.strerror)
        with contextlib.suppress(OSError):
            if self._torn:
                os.ftruncate(self._fd, self._size)
            os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1


def audit_file_sink(config: GatewayConfig) -> JsonlFileSink:
    """The gateway's audit file as its config says (one writer: the gateway, or with workers the
    supervisor's collector)."""
    audit = config.audit
    try:
        key = load_or_create_key(config.ca_dir)
    except (OSError, ValueError) as e:
        raise ConfigError(f"audit signing key in {config.ca_dir}: {e}") from None
    return JsonlFileSink(
        config.audit_path,
        max_bytes=audit.max_bytes,
        backups=audit.backups,
        fsync=audit.fsync == "per_batch",
        chain=lambda state: Chain(
            key, state, every=audit.checkpoint_records, seconds=audit.checkpoint_seconds
        ),
    )


class StdoutSink:
    """Records on standard output, one JSON object per line."""

    def write(self, lines: list[str]) -> None:
        sys.stdout.write("".join(lines))
        sys.stdout.flush()

    def close(self) -> None:
        sys.stdout.flush()


@dataclass(slots=True)
class _Entry:
    record: Record
    # Set when the emitter waits for the writer's acknowledgement (acknowledge mode).
    done: asyncio.Future[None] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    # The trail line, when the emitter encoded it already (a record journaled first):
    # `record` is then final (time rendered, stamped) and the writer encodes nothing again.
    line: str | None = None


class AuditLog:
    """Accepts records from the event loop; a thread encodes and writes them in order."""

    def __init__(
        self,
        sinks: list[AuditSink],
        *,
        queue_size: int = 10_000,
        max_wait: float = 5.0,
        log_events: bool = True,
        acknowledge: bool = False,
        stamp: dict[str, object] | None = None,
        journal: IntentJournal | None = None,
    ) -> None:
        self._sinks = sinks
        # What went upstream before its record was written, on disk (sandgate.proxy.audit.intents).
        self._journal = journal
        # Intents a held body's end stands in for (`intend`), by decision id: put back if released.
        self._displaced: dict[str, tuple[bytes, bytes]] = {}
        # Fields every record carries (the worker that decided it): added by the writer thread.
        self._stamp = stamp or {}
        self._capacity = queue_size
        self._max_wait = max_wait
        self._log_events = log_events
        self._acknowledge = acknowledge
        self._cond = threading.Condition()
        self._items: deque[_Entry] = deque()
        self._used = 0  # places taken: queued records and reservations
        self._reserved: set[str] = set()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._sleeping = False  # the writer waits to be notified (else it polls, being busy)
        # Decision ids that found no place: True once counted as unrecorded.
        self._failed: OrderedDict[str, bool] = OrderedDict()
        self._last_log = 0.0
        self._logged_total = 0
        self.unrecorded = 0
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
        """Places taken in the queue (queued records and reservations)."""
        return self._used

    @property
    def acknowledged(self) -> bool:
        """Whether `emit` returns only once the record is on disk."""
        return self._acknowledge

    async def reserve(self, decision_id: str, intent: Record | None = None) -> bool:
        """Hold a place for the record `decision_id` will have; False when none freed up in time
        (or its `intent`, the record as known now, could not be journaled).

        The record that later carries this id (through `emit` or `emit_nowait`) takes the
        place and never waits or fails for want of room.
        """
        if not await self._take_reserved(decision_id):
            return False
        if intent is not None and self._journaled(intent, reserved=True) is None:
            # Nothing was journaled: an intent open for the id (a released hold's) still holds.
            self._give_back(decision_id)
            return False
        return True

    async def _take_reserved(self, decision_id: str) -> bool:
        if self._take(decision_id, reserve=True):
            return True
        deadline = time.monotonic() + (0 if decision_id in self._failed else self._max_wait)
        while time.monotonic() < deadline:
            await asyncio.sleep(_POLL)
            if self._take(decision_id, reserve=True):
                return True
        self._remember_failed(decision_id)
        log.warning("audit.queue_full", decision_id=decision_id, queue_size=self._capacity)
        return False

    def _journaled(self, record: Record, *, reserved: bool) -> tuple[Record, str | None, bytes | None] | None:
        """`record` as it will be written, its trail line and its intent as journaled (without a
        journal: the record unchanged, no line, no intent); None when the journal could not
        take it."""
        if self._journal is None:
            return record, None, None
        final = _with_time(record, self._stamp)
        line = trail_line(final)
        intent = self._journal.add(str(final["decision_id"]), line, reserved=reserved)
        if intent is None:
            return None
        return final, line, intent

    def intend(self, record: Record) -> bool | None:
        """Journal `record` as the one to write should this process die before the record its
        id will have (a held request's end); True once journaled, False when the journal could
        not take it (the caller fails closed), None without a journal. `close_intent` closes it.

        An intent open for that id already is an allowed exchange's reservation whose body is
        now held (an MCP call): nothing has gone upstream, so `record` stands in for it until
        `hold_ended`."""
        if self._journal is None:
            return None
        decision_id = str(record["decision_id"])
        displaced = self._journal.current(decision_id)
        journaled = self._journaled(record, reserved=True)
        if journaled is None:
            return False
        stand_in = journaled[2]
        if displaced is not None and stand_in is not None:
            self._displaced[decision_id] = (displaced, stand_in)
        return True

    def hold_ended(self, decision_id: str, *, released: bool) -> bool:
        """A hold `intend` journaled for ended. Released, the reservation its end stood in for is
        journaled again (what goes upstream now), unless the exchange's record was written or
        another record took its place meanwhile (a drain, an HTTP/2 abuse record); refused, the
        stand-in stays until the exchange's record closes it. False when the reservation could
        not be journaled again (the caller refuses the body). The intent of a held request (no
        reservation yet) stays open either way: its record closes it."""
        swap = self._displaced.pop(decision_id, None)
        if swap is None or not released or self._journal is None:
            return True
        displaced, stand_in = swap
        return self._journal.restore(decision_id, displaced, over=stand_in)

    def close_intent(self, decision_id: str) -> None:
        """The intent `intend` journaled is no longer needed (what it stood for ended). One that
        stands in for an exchange's reservation stays: that exchange's record closes it."""
        if self._displaced.pop(decision_id, None) is not None:
            return
        if self._journal is not None:
            self._journal.done((decision_id,))

    def cover(self, record: Record, decision_ids: list[str]) -> None:
        """`record` (to be emitted) stands for the records of `decision_ids`, requests it cut:
        their places are given back, and it is journaled first so that their intents can close
        now. Should the journal refuse it, their intents stay open until it is written (the
        writer closes the ids it names in `streams_cut`)."""
        for decision_id in decision_ids:
            self._give_back(decision_id)
        if self._journal is None or not decision_ids:
            return
        if self._journaled(record, reserved=False) is not None:
            self._journal.done(decision_ids)

    def _give_back(self, decision_id: str) -> None:
        with self._cond:
            if decision_id in self._reserved:
                self._reserved.discard(decision_id)
                self._used -= 1

    async def emit(self, record: Record) -> bool:
        """Queue a record, waiting for a place up to max_wait (and, in acknowledge mode, until
        it is on disk). False: it could not be queued, the caller denies (counted, logged).

        Journaled as an intent first (`_journal_first`): a record of what lets traffic go, and
        a record whose id has an intent open."""
        lets_go = record.get("decision") in _LETS_GO
        first = self._journal_first(record, lets_go=lets_go)
        if first is None:
            self._count_unrecorded(str(record.get("decision_id") or ""))
            return False
        record, line, undo = first
        entry = self._entry(record, line)
        if not self._put(entry):
            did = str(record.get("decision_id") or "")
            deadline = time.monotonic() + (0 if did in self._failed else self._max_wait)
            while True:
                if time.monotonic() >= deadline or self._closed:
                    self._count_unrecorded(did)
                    if lets_go:
                        self._take_back(did, undo)
                    return False
                await asyncio.sleep(_POLL)
                if self._put(entry):
                    break
        if entry.done is not None:
            await entry.done
        return True

    def emit_nowait(self, record: Record) -> None:
        """Queue a record without waiting (streamed-body denials, reloads): it takes its
        reservation, else a place, else goes over the bound rather than block the loop. A
        refusal journaled first and not queued stays journaled: it is what happened."""
        first = self._journal_first(record, lets_go=False)
        record, line, _ = first if first is not None else (record, None, None)
        if not self._put(_Entry(record, line=line), force=True):
            self._count_unrecorded(str(record.get("decision_id") or ""))

    def _journal_first(
        self, record: Record, *, lets_go: bool
    ) -> tuple[Record, str | None, _Undo | None] | None:
        """`record` journaled as an intent before it is queued when it lets traffic go (an
        allow, report mode's would_deny: a death before its write must not lose it) or when an
        intent is open for its id (a reserved request refused: its `R allow` must not outlive
        the refusal). (The record as it will be written, its line or None when not journaled,
        how to take the intent back); None when the journal could not take it."""
        if self._journal is None:
            return record, None, None
        decision_id = str(record.get("decision_id") or "")
        previous = self._journal.current(decision_id) if decision_id else None
        if not lets_go and previous is None:
            return record, None, None
        # Encoded once, here: the intent and the trail line are the same text.
        journaled = self._journaled(record, reserved=False)
        if journaled is None:
            return None
        final, line, mine = journaled
        return final, line, (mine, previous) if mine is not None else None

    def _take_back(self, decision_id: str, undo: _Undo | None) -> None:
        """What lets traffic go could not be queued (the traffic is refused): its intent goes,
        and what it replaced, if anything, is journaled again, so a death never writes what
        never happened."""
        if self._journal is None or undo is None:
            return
        mine, previous = undo
        if previous is not None:
            self._journal.restore(decision_id, previous, over=mine)
        else:
            self._journal.done((decision_id,))

    def close(self, timeout: float = 10.0) -> None:
        """Write out everything queued, stop the thread, fsync and close the sinks."""
        with self._cond:
            if self._closed and self._thread is None:
                return
            self._closed = True
            self._cond.notify()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.error("audit.close_timeout", queued=len(self._items))
        for sink in self._sinks:
            try:
                sink.close()
            except Exception:
                log.exception("audit.sink_close_failed", sink=type(sink).__name__)
        if self._journal is not None:
            open_intents = self._journal.open_intents
            self._journal.close()
            if open_intents:
                # Records that never reached the trail: settled by the next start.
                log.error("audit.close_open_intents", intents=open_intents, journal=str(self._journal.path))

    # -- places in the queue -----------------------------------------------------------------

    def _entry(self, record: Record, line: str | None) -> _Entry:
        if not self._acknowledge:
            return _Entry(record, line=line)
        loop = asyncio.get_running_loop()
        return _Entry(record, loop.create_future(), loop, line)

    def _take(self, decision_id: str, *, reserve: bool) -> bool:
        with self._cond:
            if self._closed or self._used >= self._capacity:
                return False
            self._used += 1
            if reserve:
                self._reserved.add(decision_id)
            return True

    def _put(self, entry: _Entry, *, force: bool = False) -> bool:
        """Queue the entry in its reserved place, or a free one (or over the bound with force)."""
        did = entry.record.get("decision_id")
        with self._cond:
            if self._closed:
                return False
            if isinstance(did, str) and did in self._reserved:
                self._reserved.discard(did)
            elif self._used < self._capacity or force:
                self._used += 1
            else:
                return False
            self._items.append(entry)
            if self._sleeping:
                self._cond.notify()  # else the busy writer finds it within _POLL_WRITER
        return True

    def _remember_failed(self, decision_id: str, *, counted: bool = False) -> None:
        self._failed[decision_id] = counted or self._failed.get(decision_id, False)
        while len(self._failed) > _FAILED_IDS:
            self._failed.popitem(last=False)

    def _count_unrecorded(self, decision_id: str) -> None:
        """One more decision without a record (once per decision id), logged at most once a second."""
        if self._failed.get(decision_id):
            return
        self._remember_failed(decision_id or new_decision_id(), counted=True)
        self.unrecorded += 1
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY:
            log.error(
                "audit.unrecorded",
                total=self.unrecorded,
                since_last=self.unrecorded - self._logged_total,
                queue_size=self._capacity,
                closed=self._closed,
            )
            self._last_log, self._logged_total = now, self.unrecorded

    # -- the writer thread -------------------------------------------------------------------

    def _run(self) -> None:
        wrote = -_BUSY  # monotonic time of the last batch written
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    if self._acknowledge or time.monotonic() - wrote >= _BUSY:
                        # Asleep: whoever queues a record wakes it (under this lock, so no
                        # record is queued between the check above and the wait).
                        self._sleeping = True
                        try:
                            self._cond.wait()
                        finally:
                            self._sleeping = False
                    else:
                        self._cond.wait(_POLL_WRITER)
                if not self._items:
                    return  # closed and drained
                batch = [self._items.popleft() for _ in range(min(_BATCH, len(self._items)))]
                self._used -= len(batch)
            self._write(batch)
            self._acknowledge_batch(batch)
            wrote = time.monotonic()

    def _acknowledge_batch(self, batch: list[_Entry]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for e in batch:
            if e.done is not None and e.loop is not None:
                by_loop.setdefault(e.loop, []).append(e.done)
        for loop, futures in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, futures)

    def _write(self, entries: list[_Entry]) -> None:
        batch = [e.record if e.line is not None else _with_time(e.record, self._stamp) for e in entries]
        lines = [e.line if e.line is not None else trail_line(r) for e, r in zip(entries, batch, strict=True)]
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
        if self._journal is not None:
            # An aggregate's record also closes the intents of the requests it names.
            self._journal.done(
                [str(r["decision_id"]) for r in batch]
                + [str(i) for r in batch for i in r.get("streams_cut", ())]
            )
        # No event built per record when info lines are filtered out (the level can change).
        if self._log_events and _info_enabled():
            for r in batch:
                if r.get("event") == "decision":
                    log.info("egress.decision", **{k: v for k, v in r.items() if k != "event"})


def _info_enabled() -> bool:
    """Whether structlog, as configured now, writes info lines of this logger."""
    enabled = getattr(log.bind(), "is_enabled_for", None)
    return True if enabled is None else bool(enabled(logging.INFO))


def _settle(futures: list[asyncio.Future[None]]) -> None:
    for f in futures:
        if not f.done():
            f.set_result(None)


def _with_time(record: Record, stamp: dict[str, object]) -> Record:
    """The record with an epoch `time` rendered as RFC 3339, an id (the stream dedupes by it),
    and the `stamp` fields."""
    if stamp:
        record = {**record, **stamp}
    t = record.get("time")
    if isinstance(t, float):
        record = {**record, "time": format_time(t)}
    if not record.get("decision_id"):
        record = {**record, "decision_id": new_decision_id()}
    return record
