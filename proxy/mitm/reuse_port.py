"""The explicit proxy listener bound with SO_REUSEPORT, so every worker of a gateway accepts on it.

With workers (proxy/workers/), each gateway process binds the same explicit port and the kernel
spreads new connections over them. mitmproxy's `AsyncioServerInstance.listen` calls
`asyncio.start_server(self.handle_stream, host, port)` with no way to ask for SO_REUSEPORT;
`install()` gives `RegularInstance` (mode `regular`, the explicit listener only: transparent and
DNS ports stay one worker's each) a `listen` that passes `reuse_port=True`. The supervisor checks
the port is free before it starts the workers, so no other process can be sharing it.

mitmproxy's server internals are not an API: `install()` checks the seam first and raises
RuntimeError (start-up fails) when it moved (pinned to 12.3.x in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from mitmproxy.proxy import mode_servers

__all__ = ["install", "self_test"]

# The line of mitmproxy's `listen` this module replaces; its absence means the seam moved.
_SEAM = "asyncio.start_server(self.handle_stream, host, port)"

_installed = False


def self_test() -> None:
    """Raise RuntimeError when mitmproxy's listen is not the one this patch was written for."""
    instance = getattr(mode_servers, "RegularInstance", None)
    base = getattr(mode_servers, "AsyncioServerInstance", None)
    if instance is None or base is None or not issubclass(instance, base):
        raise RuntimeError("mitmproxy moved RegularInstance: SO_REUSEPORT cannot be set")
    listen = getattr(base, "listen", None)
    if listen is None or not inspect.iscoroutinefunction(listen) or not hasattr(base, "handle_stream"):
        raise RuntimeError("mitmproxy's AsyncioServerInstance.listen moved: SO_REUSEPORT cannot be set")
    try:
        source = inspect.getsource(listen)
    except (OSError, TypeError) as e:
        raise RuntimeError(f"mitmproxy's listen cannot be checked: {e}") from None
    if _SEAM not in source:
        raise RuntimeError("mitmproxy's listen no longer calls start_server as expected: SO_REUSEPORT")


def install() -> None:
    """Make mitmproxy's explicit (regular) listeners bind with SO_REUSEPORT (once per process)."""
    global _installed
    if _installed:
        return
    self_test()
    original = mode_servers.AsyncioServerInstance.listen

    async def listen(self: Any, host: str, port: int) -> list[Any]:
        if port == 0 or self.mode.transport_protocol != "tcp":
            # Port 0 is "any free port", which no two workers would share anyway.
            return await original(self, host, port)
        return [await asyncio.start_server(self.handle_stream, host, port, reuse_port=True)]

    mode_servers.RegularInstance.listen = listen  # type: ignore[method-assign]
    _installed = True
