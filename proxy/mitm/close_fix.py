"""A close that always closes: mitmproxy 12.3 can leave a socket open after CloseConnection.

`ConnectionHandler.close_connection` only cancels the connection's reader task; that task
closes the socket itself when the cancellation reaches it while it reads. When the close
comes from another task (a hook's, a wakeup's: a refused head found in events queued while
a hook ran) and the reader is waiting for the event lock at that moment, the cancellation
escapes before its cleanup: the socket stays open, unread and unwritten, until the process
exits (the guest never learns it was refused; one fd gone for good). `install()` closes
the writer itself, `_GRACE` seconds later, if it is still open then.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from mitmproxy.connection import Connection, ConnectionState
from mitmproxy.proxy import server

__all__ = ["install"]

_installed = False
_GRACE = 2.0  # seconds


def _close(writer: Any) -> None:
    with contextlib.suppress(Exception):
        if not writer.is_closing():
            writer.close()


def install() -> None:
    """Wrap `ConnectionHandler.close_connection` once per process (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    original = server.ConnectionHandler.close_connection

    def close_connection(
        self: server.ConnectionHandler, connection: Connection, half_close: bool = False
    ) -> None:
        original(self, connection, half_close)
        io = self.transports.get(connection)
        if connection.state is ConnectionState.CLOSED and io is not None and io.writer is not None:
            # A safety net, late on purpose: closing at once would reset a peer still sending
            # before it read our last bytes (a 431, a GOAWAY); the reader task closes it first.
            asyncio.get_running_loop().call_later(_GRACE, _close, io.writer)

    server.ConnectionHandler.close_connection = close_connection  # type: ignore[method-assign]
