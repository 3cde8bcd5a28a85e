"""mitmproxy's listening sockets, given a deeper accept queue than asyncio's default."""

from __future__ import annotations

import asyncio

from mitmproxy.addons.proxyserver import Proxyserver

__all__ = ["widen_listen_backlog"]


def widen_listen_backlog(proxyserver: Proxyserver, backlog: int) -> int:
    """Re-listen mitmproxy's TCP listeners with `backlog`; returns how many it changed.

    mitmproxy listens with asyncio's default of 100: a burst of connects overflows it, and every
    client whose SYN is dropped (other tenants too) waits a 1 s retransmit.
    """
    changed = 0
    for instance in proxyserver.servers:
        for srv in getattr(instance, "_servers", []):
            if not isinstance(srv, asyncio.Server):
                continue
            for sock in srv.sockets:
                with sock.dup() as dup:  # the same listening socket; listen() resizes its queue
                    dup.listen(backlog)
                changed += 1
    return changed
