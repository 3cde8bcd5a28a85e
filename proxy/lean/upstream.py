"""A new upstream connection for the lean layer, when the tunnel's own one has closed.

A kept-alive upstream may close while a request is read or decided (a hold for approval can
outlast its idle timeout). mitmproxy's general path then dials a new connection
(`HttpLayer.get_connection`); the tunnel's own `Server` cannot be opened again (mitmproxy
would reuse its local address, and the tunnel's TLS layer above is done with it). `Redial` is
that new connection: a new `Server` (same address, the old one's SNI, only HTTP/1.1 offered, same
`via`) behind its own layers, stacked as `get_connection` stacks them (an upstream proxy, TLS),
with `_Pipe` at the bottom in place of mitmproxy's HTTP client.

The lean layer runs the stack: it hands it the events of the connections the stack opened and
the replies to the commands it waits for (`owns`, `feed`), passes the stack's commands up, and
acts on what `_Pipe` reports (`Dialed`, `Read`); what it sends on or closes of the new server
goes down through the stack (`send`, `close`), which encrypts it.
"""

from __future__ import annotations

from mitmproxy.connection import Connection, Server
from mitmproxy.proxy import commands, events, layer, tunnel
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.http._upstream_proxy import HttpUpstreamProxy
from mitmproxy.proxy.layers.tls import ServerTLSLayer

__all__ = ["Dialed", "Read", "Redial"]

# The lean layer speaks HTTP/1.1 to the guest: the new upstream may not switch to h2.
_HTTP11 = (b"http/1.1",)


class Dialed(commands.Command):
    """The new connection is up (`error` None), or could not be made (TCP or TLS)."""

    def __init__(self, error: str | None) -> None:
        self.error = error


class Read(commands.Command):
    """What the upstream sent on the new connection, decrypted; None: it closed."""

    def __init__(self, data: bytes | None) -> None:
        self.data = data


class _Send(events.Event):
    def __init__(self, data: bytes) -> None:
        self.data = data


class _Close(events.Event):
    pass


class _Pipe(layer.Layer):
    """The bottom of the stack: opens the connection, and carries plain bytes both ways."""

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        server = self.context.server
        if isinstance(event, events.Start):
            error = yield commands.OpenConnection(server)  # answered once TLS is up (or failed)
            yield Dialed(error)
        elif isinstance(event, events.DataReceived):
            yield Read(event.data)
        elif isinstance(event, events.ConnectionClosed):
            yield Read(None)
        elif isinstance(event, _Send):
            yield commands.SendData(server, event.data)
        elif isinstance(event, _Close):
            yield commands.CloseConnection(server)


class Redial:
    """A new connection to the address of `old`, for the lean layer of `context` (see the module doc)."""

    def __init__(self, context: Context, old: Server) -> None:
        ctx = context.fork()
        server = ctx.server = Server(address=old.address)
        # The old server's SNI is the name DialGuard permitted (never the guest's); None: it sets it.
        server.sni = old.sni
        if old.alpn_offers or context.client.alpn_offers:
            server.alpn_offers = _HTTP11  # else none, as the guest offered none
        stack = tunnel.LayerStack()
        if old.via is not None:
            server.via = old.via
            stack /= HttpUpstreamProxy.make(ctx, True)
        if old.tls:
            stack /= ServerTLSLayer(ctx)
        stack /= _Pipe(ctx)
        self.server = server
        self.top = stack[0]
        self.connections: list[Server] = []  # those the stack opened (the proxy's, the server)
        self.waiting: list[commands.Command] = []  # the stack's commands whose replies it awaits
        self.reported_closed: list[Connection] = []

    @property
    def finished(self) -> bool:
        """No event can come for the stack any more: it awaits no reply, and each connection it
        opened never connected or had its close reported (mitmproxy reports it once)."""
        return not self.waiting and all(
            c.timestamp_tcp_setup is None or any(c is d for d in self.reported_closed)
            for c in self.connections
        )

    def owns(self, event: events.Event) -> bool:
        """Whether `event` is for this stack: on a connection it opened, or a reply it awaits."""
        if isinstance(event, events.ConnectionEvent):
            return any(c is event.connection for c in self.connections)
        if isinstance(event, events.CommandCompleted):
            return any(c is event.command for c in self.waiting)
        return False

    def feed(self, event: events.Event) -> list[commands.Command]:
        """The stack's commands for `event`, all of them (the caller may feed it again)."""
        if isinstance(event, events.CommandCompleted):
            self.waiting = [c for c in self.waiting if c is not event.command]
        elif isinstance(event, events.ConnectionClosed):
            self.reported_closed.append(event.connection)
        produced = list(self.top.handle_event(event))
        for command in produced:
            if isinstance(command, commands.OpenConnection):
                self.connections.append(command.connection)
            # A layer in the stack set `blocking` to itself: its reply comes back here.
            if command.blocking or isinstance(command, commands.RequestWakeup):
                self.waiting.append(command)
        return produced

    def start(self) -> list[commands.Command]:
        return self.feed(events.Start())

    def send(self, data: bytes) -> list[commands.Command]:
        return self.feed(_Send(data))

    def close(self) -> list[commands.Command]:
        return self.feed(_Close())
