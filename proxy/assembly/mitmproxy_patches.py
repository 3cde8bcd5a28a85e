"""Everything sandgate changes inside mitmproxy, installed by one call that returns the
self-checks proving mitmproxy's internals are still where the changes and the addons expect
them (its embedding API is no promise): a check that fails stops the gateway's start.
"""

from __future__ import annotations

from collections.abc import Callable

from mitmproxy import connection
from mitmproxy.options import Options

from sandgate.proxy.addons import heads
from sandgate.proxy.addons.connection_limits import check_seams as check_connection_seams
from sandgate.proxy.addons.h2_guard import check_seam as check_h2_seam
from sandgate.proxy.addons.http_seam import check_seam as check_http_seam
from sandgate.proxy.addons.trailers import patch_http1_trailers
from sandgate.proxy.addons.tunnel_rules import count_tunnel_bytes
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.front.handoff import self_test as handoff_self_test
from sandgate.proxy.mitm import (
    backpressure,
    close_fix,
    reuse_port,
    speedups,
    tunnel_meter,
    websocket_guard,
)
from sandgate.proxy.startup.bindcheck import quiet_mitmproxy_bind_errors

__all__ = ["SelfCheck", "install_mitmproxy_patches"]

# Raises (RuntimeError, SeamMoved) when what it checks moved; reads the master's options.
SelfCheck = Callable[[Options], None]


def install_mitmproxy_patches(config: GatewayConfig, ctx: GatewayContext) -> list[SelfCheck]:
    """Install the patches (each once per process) and return the self-checks, to run once the
    master's addons declared their options. A patch that cannot be installed raises here."""
    quiet_mitmproxy_bind_errors()  # a taken port is one line of sandgate's, not mitmproxy's
    heads.install()  # caps on HTTP/1 heads, inside mitmproxy's HTTP/1 layer
    close_fix.install()
    # Bytes that pile up behind a pending hook pause the reader (one value per process).
    backpressure.install(config.connections.max_held_bytes)
    speedups.install()  # mitmproxy's per-event costs: hook dispatch, field checks, option reads
    # Bytes a guest sends into a tunnel mitmproxy passes through count against its limits.
    tunnel_meter.install(lambda client, nbytes: _count(ctx, client, nbytes))
    patch_http1_trailers()
    websocket_guard.install()  # a cap on one message, control frames checked, clean closes
    if config.worker.count > 1 or config.passthrough.front:
        # The explicit port shared by workers (SO_REUSEPORT); its connections through the front.
        reuse_port.install(reuse_port=config.worker.count > 1)
    checks: list[SelfCheck] = [
        lambda _: check_http_seam(),  # the HTTP error seam's hooks and its 400
        lambda _: check_connection_seams(),  # what the idle sweep reads
        check_h2_seam,  # the HTTP/2 guard, installed and enforcing on a real HttpLayer
        heads.self_test,
        websocket_guard.self_test,
    ]
    if config.passthrough.front:
        checks.append(lambda _: handoff_self_test())  # where asyncio's StreamReader keeps its bytes
    return checks


def _count(ctx: GatewayContext, client: connection.Client, nbytes: int) -> bool:
    return count_tunnel_bytes(ctx, ctx.connections.get(client.id), nbytes)
