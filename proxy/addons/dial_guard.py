"""Addon: the dial chokepoint. An upstream connection opens only to an address this client
connection was allowed to dial (a tunnel's checked address, or one a request outside a tunnel
was allowed to), and never after a later layer denied; the upstream's SNI is the name the
address was allowed for. Guarded: a fault refuses the dial.
"""

from __future__ import annotations

import structlog
from mitmproxy.proxy import server_hooks

from sandgate.proxy.context import GatewayContext

__all__ = ["DialGuard"]

log = structlog.get_logger("sandgate.gate")


class DialGuard:
    """Refuses every upstream connection the connection's state does not permit."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        try:
            state = self.ctx.connections.get(data.client.id)
            address = data.server.address
            if state is None or address is None:
                data.server.error = "sandgate: no approved destination"
                return
            if state.denied is not None:
                data.server.error = f"sandgate: {state.denied.value}"
                return
            permitted_host = state.dial_permits.get((str(address[0]), int(address[1])))
            if permitted_host is None:
                data.server.error = "sandgate: destination not approved"
                return
            if data.server.sni is None or data.server.sni == address[0]:
                data.server.sni = permitted_host
        except Exception:
            log.exception("hook_failed", hook="server_connect")
            data.server.error = "sandgate: internal error"
