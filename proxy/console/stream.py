"""The live decisions as server-sent events: each stream gets the newest matching records, then
every new one the shared tail (sandgate.proxy.console.feed) hands it, filtered on the server by
tenant, sandbox, decision, reason and host.

A stream beyond `console.max_stream_clients` is refused (503); one whose reader falls behind
is closed (the browser's EventSource reconnects and starts again from the newest records)."""

from __future__ import annotations

import asyncio
import re

from tornado.http1connection import HTTP1Connection
from tornado.iostream import StreamClosedError
from tornado.web import HTTPError

from sandgate.proxy.audit.query import Query
from sandgate.proxy.console.base import ConsoleHandler
from sandgate.proxy.console.feed import Subscriber, sse_event

__all__ = ["BACKLOG", "DecisionStream", "query_from"]

# Records a new stream starts with.
BACKLOG = 50
# A comment line this often keeps proxies and the browser from timing the stream out.
KEEPALIVE_SECONDS = 15.0
# Seconds between two writes to one stream (its records queue meanwhile, up to QUEUE_MAX).
FLUSH_SECONDS = 0.1
_VALUE = re.compile(r"^[A-Za-z0-9_.:*/-]{1,253}$")


def query_from(values: dict[str, str]) -> Query:
    """The filter of a stream from its query arguments (empty ones select everything)."""

    def one(name: str) -> frozenset[str]:
        value = values.get(name, "").strip()
        if not value:
            return frozenset()
        if not _VALUE.fullmatch(value):
            raise HTTPError(400, reason=f"{name}: letters, digits and . _ - : * / only")
        return frozenset({value})

    host = values.get("host", "").strip().lower()
    if host and not _VALUE.fullmatch(host):
        raise HTTPError(400, reason="host: a host name or *.suffix")
    return Query(
        tenants=one("tenant"),
        sandboxes=one("sandbox"),
        decisions=one("decision"),
        reasons=one("reason"),
        hosts=(host,) if host else (),
    )


class DecisionStream(ConsoleHandler):
    api = True

    async def get(self) -> None:
        names = ("tenant", "sandbox", "decision", "reason", "host")
        query = query_from({n: self.get_query_argument(n, "") for n in names})
        feed = self.console.feed
        self._gone = False
        subscriber = feed.subscribe(query, self._drop)
        if subscriber is None:
            raise HTTPError(503, reason=f"{feed.max_clients} live streams are open already")
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("X-Accel-Buffering", "no")
        self._subscriber = subscriber
        try:
            self.write(": connected\n\n")
            for record in await feed.backlog(query, BACKLOG):
                self.write(sse_event(record))
            await self.flush()
            await self._relay(subscriber)
        except StreamClosedError:
            pass
        finally:
            feed.unsubscribe(subscriber)

    async def _relay(self, subscriber: Subscriber) -> None:
        while not subscriber.dropped and not self._gone:
            try:
                await asyncio.wait_for(subscriber.ready.wait(), KEEPALIVE_SECONDS)
            except TimeoutError:
                self.write(": keepalive\n\n")
                await self.flush()
                continue
            subscriber.ready.clear()
            while subscriber.queue:
                self.write(subscriber.queue.popleft())
            await self.flush()
            # At most one write a tick per stream: under load, records go out in batches
            # (a person reads no faster), not one event-loop turn per record per stream.
            await asyncio.sleep(FLUSH_SECONDS)

    def _drop(self) -> None:
        """The reader fell behind: close its connection now (a flush it waits on fails)."""
        connection = self.request.connection
        if isinstance(connection, HTTP1Connection):
            connection.close()

    def on_connection_close(self) -> None:
        self._gone = True
        subscriber = getattr(self, "_subscriber", None)
        if subscriber is not None:
            subscriber.ready.set()
