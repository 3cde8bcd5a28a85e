"""The live decisions: one thread tails the audit trail (as `sandgate audit tail --follow`
does: the fleet stream in a fleet, else the file, sandgate.proxy.console.trail) and hands each
decision record to the open streams, each with its own filter.

Nothing here is on a request's path: the tail reads the file the writer thread already wrote.
Fan-out is bounded: at most `max_clients` streams, each with a queue of `QUEUE_MAX` records;
a stream whose reader falls that far behind is dropped (closed), never buffered without bound.
The tail runs while at least one stream is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import deque
from collections.abc import Callable

import structlog

from sandgate.proxy.audit.query import AuditInputError, Query, Record
from sandgate.proxy.console.trail import Trail

__all__ = ["QUEUE_MAX", "DecisionFeed", "Subscriber", "sse_event"]

log = structlog.get_logger("sandgate.console")

# Records waiting for one stream's reader at most; one more and the stream is dropped.
QUEUE_MAX = 1000


def sse_event(record: Record) -> str:
    """One record as a server-sent event: one line of JSON, so one `data:` field."""
    return f"event: decision\ndata: {json.dumps(record, separators=(',', ':'))}\n\n"


class Subscriber:
    """One open stream: its filter, its queue, and what to do when it falls behind."""

    def __init__(self, query: Query, on_drop: Callable[[], None]) -> None:
        self.query = query
        # Encoded events, each encoded once by the tail's thread for every stream.
        self.queue: deque[str] = deque()
        self.ready = asyncio.Event()
        self.dropped = False
        self._on_drop = on_drop

    def offer(self, record: Record, event: str) -> None:
        """Queue the record's event when the record passes the filter; drop the stream when
        its queue is full."""
        if self.dropped or not self.query.matches(record):
            return
        if len(self.queue) >= QUEUE_MAX:
            self.dropped = True
            self.queue.clear()
            self.ready.set()
            self._on_drop()
            return
        self.queue.append(event)
        self.ready.set()


class DecisionFeed:
    """The tail of the audit trail, shared by every open stream."""

    def __init__(self, trail: Trail, max_clients: int) -> None:
        self.trail = trail
        self.max_clients = max_clients
        self.dropped = 0
        self._subscribers: set[Subscriber] = set()
        self._stop: threading.Event | None = None
        # Records the tail read and the loop has not taken yet: handed over in batches, one
        # wake-up of the event loop per batch, not one per record (a loop woken for every
        # record doubled the gateway's p99 with 20 streams open).
        self._pending: list[tuple[Record, str]] = []
        self._pending_lock = threading.Lock()
        self._scheduled = False

    @property
    def clients(self) -> int:
        return len(self._subscribers)

    def subscribe(self, query: Query, on_drop: Callable[[], None]) -> Subscriber | None:
        """A new stream, or None when `max_clients` are open already."""
        if len(self._subscribers) >= self.max_clients:
            return None
        subscriber = Subscriber(query, on_drop)
        self._subscribers.add(subscriber)
        if self._stop is None:
            self._start(asyncio.get_running_loop())
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        if subscriber.dropped:
            self.dropped += 1
        self._subscribers.discard(subscriber)
        if not self._subscribers and self._stop is not None:
            self._stop.set()
            self._stop = None

    def close(self) -> None:
        """Stop the tail (the gateway stops)."""
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    async def backlog(self, query: Query, n: int) -> list[Record]:
        """The newest `n` records the query selects, read backwards in a thread."""
        try:
            return await asyncio.to_thread(self.trail.open().latest, query, n)
        except AuditInputError as e:
            # No trail yet, or the fleet stream unreachable: the stream starts empty, and says so.
            log.warning("console.backlog_unread", error=str(e))
            return []

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        stop = threading.Event()
        self._stop = stop
        thread = threading.Thread(target=self._tail, args=(stop, loop), name="console-feed", daemon=True)
        thread.start()

    def _tail(self, stop: threading.Event, loop: asyncio.AbstractEventLoop) -> None:
        source = self.trail.open()
        try:
            with contextlib.closing(source.follow(Query(event="decision"), stop)) as records:
                for record in records:
                    # Encoded here, off the event loop the gateway decides on.
                    self._hand_over(loop, record, sse_event(record))
        except Exception as e:
            log.error("console.feed_failed", error=type(e).__name__)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._fail)

    def _hand_over(self, loop: asyncio.AbstractEventLoop, record: Record, event: str) -> None:
        """Queue one record for the loop; wake the loop only when no batch is waiting for it."""
        with self._pending_lock:
            self._pending.append((record, event))
            if self._scheduled:
                return
            self._scheduled = True
        loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._pending_lock:
            batch, self._pending = self._pending, []
            self._scheduled = False
        subscribers = list(self._subscribers)
        for record, event in batch:
            for subscriber in subscribers:
                subscriber.offer(record, event)

    def _fail(self) -> None:
        """The tail stopped: every stream ends (a browser reconnects and starts a new tail)."""
        for subscriber in list(self._subscribers):
            subscriber.dropped = True
            subscriber.ready.set()
        self._stop = None
