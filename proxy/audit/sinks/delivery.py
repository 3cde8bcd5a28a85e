"""A sink's delivery thread: reads batches at the queue's cursor, sends them, moves the cursor.

A batch is sent once it is full (`batch_size`) or has waited `linger` seconds to fill. The
cursor moves only once the transport returned (the receiver acknowledged). A failed send
is retried after an exponential backoff with full jitter (0.5 s doubling up to the sink's
`max_backoff_seconds`, or the receiver's Retry-After); per-event refusals that may pass later
(a bulk item's 429) are retried alone, refusals for good are counted as dropped and logged.
The thread never dies of a fault: it logs it and tries again after the longest backoff. At
stop it sends what is queued for a moment, without lingering or backing off.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Literal

import structlog

from sandgate.proxy.audit.sinks.events import Event, encode_lines
from sandgate.proxy.audit.sinks.queue import DiskQueue, Position
from sandgate.proxy.audit.sinks.transport import Retry, Transport

__all__ = ["Counters", "Delivery"]

log = structlog.get_logger("sandgate.audit")

_FIRST_DELAY = 0.5
_LOG_EVERY = 30.0  # seconds between two lines about the same outage
_IDLE = 1.0  # an idle thread looks at the queue this often (and writes its figures)


class Counters:
    """A sink's counts (plain ints: one writer each, read by metrics)."""

    def __init__(self) -> None:
        self.spooled = 0  # records queued
        self.dropped_full = 0  # records not queued: the queue was full (or closed while blocked)
        self.delivered = 0  # events the receiver acknowledged
        self.retried = 0  # events sent again after a failed attempt
        self.rejected = 0  # events refused for good (counted as dropped, why=rejected)
        self.oldest: float | None = None  # epoch time of the oldest undelivered event


class Delivery:
    """Sends what `queue` holds through `transport`, in order, at least once."""

    def __init__(
        self,
        name: str,
        queue: DiskQueue,
        transport: Transport,
        *,
        fmt: Literal["native", "ocsf"],
        batch_size: int,
        max_backoff: float,
        linger: float,
        counters: Counters,
        committed: Callable[[], None],
    ) -> None:
        self.name = name
        self._queue = queue
        self._transport = transport
        self._fmt: Literal["native", "ocsf"] = fmt
        self._batch = batch_size
        self._max_backoff = max_backoff
        self._linger = linger
        self.counters = counters
        self._committed = committed  # called after each cursor move (wakes a blocked writer)
        self.wake = threading.Event()
        self._stop = threading.Event()
        self._closing = threading.Event()  # stopping: send what is queued, no waiting
        self._gave_up = False  # while closing, an attempt failed: the rest waits for the next run
        self._thread: threading.Thread | None = None
        self._delay = _FIRST_DELAY
        self._failing_since: float | None = None
        self._last_log = 0.0
        self.on_idle: Callable[[], None] = lambda: None  # e.g. write the figures file

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"sandgate-sink-{self.name}", daemon=True)
            self._thread.start()

    def stop(self, drain: float = 2.0) -> None:
        """Send what is queued for up to `drain` seconds (no linger, no backoff: the first
        failure ends it), then stop; what is not acknowledged is sent by the next run."""
        self._closing.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(drain)
            self._stop.set()
            self._thread.join(1.0)  # an attempt in flight ends at its timeout, unwaited for
            self._thread = None
        self._transport.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sent = self._deliver_batch()
            except Exception:
                log.exception("audit.sink_crashed", sink=self.name)
                if self._closing.is_set():
                    return
                self._stop.wait(self._max_backoff)
                continue
            if self._closing.is_set() and (not sent or self._gave_up):
                return
            if not sent:
                self.counters.oldest = None
                self.on_idle()
                self.wake.wait(_IDLE)
                self.wake.clear()

    def _deliver_batch(self) -> bool:
        """Deliver the batch at the cursor (retrying until it went or the thread stops);
        False when the queue is empty."""
        lines, end = self._queue.read(self._batch)
        if not lines:
            return False
        if len(lines) < self._batch and self._linger > 0:
            # Let the batch fill: one send per `linger` under load, not one per record
            # (a request, or a TLS handshake for syslog, costs the gateway's CPU each).
            self._closing.wait(self._linger)
            lines, end = self._queue.read(self._batch)
        try:
            pending = encode_lines(lines, self._fmt)
        except Exception:
            # A record the mapping cannot render: logged with its place, never silently skipped.
            log.exception("audit.sink_encode_failed", sink=self.name, records=len(lines))
            self.counters.rejected += len(lines)
            self._commit(end)
            return True
        if pending:
            self.counters.oldest = min(e.time for e in pending)
        while pending and not self._stop.is_set():
            pending = self._attempt(pending)
            if pending and self._closing.is_set():
                self._gave_up = True
                return True
        if not pending:
            self._commit(end)
        return True

    def _attempt(self, events: list[Event]) -> list[Event]:
        """One send; what is left to send (after waiting the backoff when something is)."""
        try:
            sent = self._transport.send(events)
        except Retry as e:
            self.counters.retried += len(events)
            self._failed(str(e), e.after)
            return events
        self.counters.delivered += len(events) - len(sent.again) - sent.rejected
        if sent.rejected:
            self.counters.rejected += sent.rejected
            log.error("audit.sink_rejected", sink=self.name, events=sent.rejected, why=sent.why)
        if sent.again:
            self.counters.retried += len(sent.again)
            self._failed(f"{len(sent.again)} events refused for now: {sent.why}", None)
            return sent.again
        self._recovered()
        return []

    def _commit(self, end: Position) -> None:
        self._queue.commit(end)
        self._committed()

    def _failed(self, why: str, after: float | None) -> None:
        now = time.monotonic()
        wait = after if after is not None else random.uniform(0, self._delay)  # noqa: S311 (full jitter, no secret)
        if self._failing_since is None or now - self._last_log >= _LOG_EVERY:
            log.warning(
                "audit.sink_unavailable",
                sink=self.name,
                receiver=self._transport.receiver,
                why=why,
                retry_in=round(wait, 2),
                queued_bytes=self._queue.pending_bytes,
            )
            self._last_log = now
        if self._failing_since is None:
            self._failing_since = now
        self._delay = min(self._delay * 2, self._max_backoff)
        self.on_idle()
        if not self._closing.is_set():
            self._stop.wait(wait)

    def _recovered(self) -> None:
        if self._failing_since is not None:
            log.info(
                "audit.sink_recovered",
                sink=self.name,
                receiver=self._transport.receiver,
                after_seconds=round(time.monotonic() - self._failing_since, 1),
            )
        self._failing_since = None
        self._delay = _FIRST_DELAY
