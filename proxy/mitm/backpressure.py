"""Stop reading a connection whose bytes pile up behind a pending hook.

mitmproxy 12.3 reads every connection as fast as it can and hands each chunk to the layer
stack. A layer waiting for a hook (a decision that resolves a name, an OPA query, a TLS
ClientHello decision) queues every chunk that arrives meanwhile, or the body parsed from
it, without a bound: a guest that sends a request with a large body to a slowly resolving
name fills the gateway's memory for as long as the lookup takes. `install()` registers every layer with
its client connection and, after each chunk read from a connection, waits (reads no more
from it) while that connection's layers hold more than `max_queued` bytes of it; TCP flow
control then slows the sender down. Nothing waits on more data from a connection whose
layer is paused, so holding back its reads cannot stall the hook the layer waits for.

The layers are not scanned after every chunk: what a client's layers hold can only grow by what
is read from its connections, so each handler keeps an upper bound (the last scan's total plus
every byte read since) and scans only once that bound passes the cap.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from mitmproxy import connection
from mitmproxy.proxy import events, layer, server
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.http._events import RequestData, ResponseData

__all__ = ["held_bytes", "install", "queued_bytes"]

_POLL = 0.005
# client → references to its layers; a collected layer's reference removes itself
_LAYERS: weakref.WeakKeyDictionary[connection.Client, set[weakref.ref[layer.Layer]]] = (
    weakref.WeakKeyDictionary()
)
_installed = False
# ConnectionHandler attribute: the bound on the bytes its client's layers hold (see the module doc)
_BOUND = "_sandgate_held_bound"


def _held_events(client: connection.Client) -> Iterator[events.DataReceived | RequestData | ResponseData]:
    """The byte-carrying events the client's paused layers queue: raw chunks, and message bodies
    parsed from them that wait for the stream's hook."""
    layers = _LAYERS.get(client)
    if layers is None:
        return
    # A copy (one C call, which no collection interrupts: a reference can remove itself from
    # the set at any other moment), not a WeakSet's guarded generator.
    for ref in layers.copy():
        lay = ref()
        if lay is not None and lay._paused_event_queue:
            for e in lay._paused_event_queue:
                if isinstance(e, events.DataReceived | RequestData | ResponseData):
                    yield e


def queued_bytes(client: connection.Client, conn: connection.Connection) -> int:
    """Bytes read from `conn` that the client's layers hold while waiting for a hook: raw
    chunks, or message bodies parsed from them (a request's from the client, a response's
    from a server)."""
    parsed: type[RequestData | ResponseData] = RequestData if conn is client else ResponseData
    return sum(
        len(e.data)
        for e in _held_events(client)
        if (isinstance(e, events.DataReceived) and e.connection is conn) or isinstance(e, parsed)
    )


def held_bytes(client: connection.Client) -> int:
    """Bytes read from any of the client's connections that its layers hold now (every queued
    chunk and parsed body): what the bound kept per handler restarts from after a scan."""
    return sum(len(e.data) for e in _held_events(client))


def install(max_queued: int) -> None:
    """Wrap `Layer.__init__` and `ConnectionHandler.server_event` once per process (the first
    caller's `max_queued` holds for every gateway in the process)."""
    global _installed
    if _installed:
        return
    _installed = True
    init: Callable[..., None] = layer.Layer.__init__
    server_event: Callable[..., Coroutine[Any, Any, None]] = server.ConnectionHandler.server_event

    def __init__(self: layer.Layer, context: Context) -> None:
        init(self, context)
        refs = _LAYERS.get(context.client)
        if refs is None:
            refs = _LAYERS[context.client] = set()
        refs.add(weakref.ref(self, refs.discard))

    async def _server_event(self: server.ConnectionHandler, event: events.Event) -> None:
        await server_event(self, event)
        if not isinstance(event, events.DataReceived):
            return
        # An upper bound of what this client's layers hold: nothing to scan while it is under the cap.
        bound = self.__dict__.get(_BOUND, 0) + len(event.data)
        if bound <= max_queued:
            self.__dict__[_BOUND] = bound
            return
        conn = event.connection
        # Polled, and only while over the cap: the layers signal nothing when they resume.
        while queued_bytes(self.client, conn) > max_queued and conn.connected:  # noqa: ASYNC110
            await asyncio.sleep(_POLL)
        self.__dict__[_BOUND] = held_bytes(self.client)

    layer.Layer.__init__ = __init__  # type: ignore[method-assign]
    server.ConnectionHandler.server_event = _server_event  # type: ignore[method-assign]
