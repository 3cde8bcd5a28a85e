"""The explicit proxy listener: bound with SO_REUSEPORT (workers), and read first by the front.

With a front registered for a Proxyserver (`set_front`: the passthrough front of
sandgate.proxy.front), its explicit listeners' connections go to the front's handler, which
hands mitmproxy's `handle_stream` what it does not serve itself.

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
import weakref
from collections.abc import Callable
from typing import Any

from mitmproxy.proxy import mode_servers

__all__ = ["install", "self_test", "set_front"]

# The line of mitmproxy's `listen` this module replaces; its absence means the seam moved.
_SEAM = "asyncio.start_server(self.handle_stream, host, port)"

_installed = False
_reuse_port = False
# Per Proxyserver (mitmproxy's ServerManager): the factory of its explicit listeners' handler,
# given the listener's spec and mitmproxy's handle_stream.
_fronts: weakref.WeakKeyDictionary[Any, Callable[[str, Any], Any]] = weakref.WeakKeyDictionary()


def set_front(manager: Any, front: Callable[[str, Any], Any] | None) -> None:
    """Route the explicit listeners `manager` starts from now on through `front` (None: not)."""
    if front is None:
        _fronts.pop(manager, None)
    else:
        _fronts[manager] = front


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


def install(*, reuse_port: bool = True) -> None:
    """Take over how mitmproxy's explicit (regular) listeners bind: with SO_REUSEPORT when
    `reuse_port` (workers; it stays on for the process), and through a registered front."""
    global _installed, _reuse_port
    _reuse_port = _reuse_port or reuse_port
    if _installed:
        return
    self_test()
    original = mode_servers.AsyncioServerInstance.listen

    async def listen(self: Any, host: str, port: int) -> list[Any]:
        if port == 0 or self.mode.transport_protocol != "tcp":
            # Port 0 is "any free port" (mitmproxy picks one and calls listen again with it),
            # which no two workers would share anyway.
            return await original(self, host, port)
        manager = getattr(self, "manager", None)
        front = _fronts.get(manager) if manager is not None else None
        handler = front(self.mode.full_spec, self.handle_stream) if front is not None else self.handle_stream
        return [await asyncio.start_server(handler, host, port, reuse_port=_reuse_port or None)]

    mode_servers.RegularInstance.listen = listen  # type: ignore[method-assign]
    _installed = True
