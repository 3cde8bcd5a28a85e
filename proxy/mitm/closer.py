"""Close a live connection's sockets from a hook, at once.

mitmproxy's TCP and WebSocket layers do not honour `flow.kill()`, and after a `101` the
upstream connection is already open (`server_connect` never runs again): only the
connection's handler can close its sockets. Closing the client ends the handler, which
closes every upstream socket it still holds; naming the upstream closes it first.
"""

from __future__ import annotations

import structlog
from mitmproxy import connection
from mitmproxy.addons.proxyserver import Proxyserver

__all__ = ["ConnectionCloser"]

log = structlog.get_logger("sandgate.closer")


class ConnectionCloser:
    """Closes both sides of a client connection through the proxy server that handles it."""

    def __init__(self, proxyserver: Proxyserver) -> None:
        self._proxyserver = proxyserver

    def close(
        self, client: connection.Client, *servers: connection.Server | None, keep_client: bool = False
    ) -> bool:
        """Close `servers`, then `client` unless `keep_client` (it is answered and closed by
        mitmproxy); False when the connection is not live any more."""
        handler = self._proxyserver.connections.get(client.id)
        if handler is None:
            return False
        for conn in (*servers, *(() if keep_client else (client,))):
            if conn is not None and conn in handler.transports:
                try:
                    handler.close_connection(conn)
                except Exception:
                    # A socket that cannot be closed cleanly is dropped by the handler's teardown.
                    log.exception("close_failed")
        return True
