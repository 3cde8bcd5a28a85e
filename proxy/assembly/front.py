"""The passthrough front's builder: it reads the explicit listeners' connections before
mitmproxy does and splices allowed TLS tunnels itself (sandgate.proxy.front)."""

from __future__ import annotations

from mitmproxy.addons.proxyserver import Proxyserver

from sandgate.proxy.addons.connection_limits import ConnectionLimits
from sandgate.proxy.addons.drain import Drainer
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.front.passthrough import PassthroughFront
from sandgate.proxy.mitm.reuse_port import set_front

__all__ = ["build_front"]


def build_front(
    config: GatewayConfig,
    ctx: GatewayContext,
    server: Proxyserver,
    connection_limits: ConnectionLimits,
    drainer: Drainer,
) -> PassthroughFront | None:
    """The front, put in the way of `server`'s explicit listeners and counted by the drain;
    None when `passthrough.front` is off."""
    if not config.passthrough.front:
        return None
    front = PassthroughFront(
        ctx,
        connection_limits,
        drainer,
        heads=config.heads,
        connections=config.connections,
        require_sni=config.passthrough.require_sni,
    )
    drainer.held = front
    set_front(server, front.handler_for)
    return front
