"""Count what a guest sends through a tunnel mitmproxy passes through without a flow.

A passed-through TLS connection is relayed by mitmproxy's TCP layer with `ignore=True`: no
flow, no hook, so nothing counted its bytes against a tenant's egress limit. `install(meter)`
wraps that layer's relay: each chunk from the client of an ignored layer goes to `meter(client,
nbytes)` first; False (or a meter that raises) cuts the tunnel: both sides closed, the chunk
not forwarded. Layers with a flow (raw TCP) are left to the `tcp_message` hook. One meter per
process.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from mitmproxy import connection
from mitmproxy.connection import ConnectionState
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers.tcp import TCPLayer

__all__ = ["Meter", "install"]

log = structlog.get_logger("sandgate.mitm")

Meter = Callable[[connection.Client, int], bool]

_meter: Meter | None = None
_installed = False


def install(meter: Meter) -> None:
    """Meter ignored TCP layers' client bytes with `meter` (the wrap happens once per process)."""
    global _meter, _installed
    _meter = meter
    if _installed:
        return
    _installed = True
    relay = TCPLayer.relay_messages

    def relay_messages(self: TCPLayer, event: events.Event) -> layer.CommandGenerator[None]:
        client = self.context.client
        if (
            self.flow is None
            and _meter is not None
            and isinstance(event, events.DataReceived)
            and event.connection is client
            and not _metered(_meter, client, len(event.data))
        ):
            self._handle_event = self.done
            for conn in (self.context.server, client):
                if conn.state is not ConnectionState.CLOSED:
                    yield commands.CloseConnection(conn)
            return
        yield from relay(self, event)

    TCPLayer.relay_messages = relay_messages  # type: ignore[method-assign]


def _metered(meter: Meter, client: connection.Client, nbytes: int) -> bool:
    """The meter's answer; a meter that fails cuts the tunnel (logged, no layer crash)."""
    try:
        return meter(client, nbytes)
    except Exception:
        log.exception("tunnel_meter.failed")
        return False
