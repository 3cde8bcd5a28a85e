"""Guest connections as the connection limits count them: unidentified ones per source, oldest
first (the ones eviction may reclaim), identified ones per sandbox, and each worker's share of
the gateway-wide caps. Pure bookkeeping: sandgate.proxy.addons.connection_limits decides with it.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from sandgate.proxy.config import ConnectionsConfig

__all__ = ["RECLAIM_SCAN", "ConnectionTable", "Reclaimable", "Shares"]

# How many of the oldest unidentified connections are looked at for an idle one: those not idle
# are about to be read (transient), so past this many the rest are too new to be worth a look.
RECLAIM_SCAN = 64


class Reclaimable(Protocol):
    """A connection as eviction sees it, wherever it is served (mitmproxy, the front)."""

    def idle(self) -> bool:
        """Idle for eviction: nothing of it unread, no hook deciding for it, quiet for a
        moment (sandgate.proxy.addons.connection_limits)."""
        ...

    def close(self) -> None:
        """Close it now (its disconnect is reported as usual)."""
        ...


@dataclass(frozen=True, slots=True)
class Shares:
    """This worker's part of the gateway-wide caps (0: no cap)."""

    per_source: int
    # Explicit-proxy connections: the kernel spreads a sandbox's over every worker.
    per_sandbox: int
    # Transparent connections: the host steers a sandbox to one worker, which holds its whole cap.
    per_steered_sandbox: int

    @classmethod
    def of(cls, cfg: ConnectionsConfig, workers: int) -> Shares:
        return cls(
            _share(cfg.max_per_source, workers), _share(cfg.max_per_sandbox, workers), cfg.max_per_sandbox
        )


def _share(cap: int, workers: int) -> int:
    """ceil(cap / workers), so the workers' shares add up to the cap when it divides evenly."""
    return -(-cap // max(1, workers)) if cap else 0


@dataclass(slots=True)
class _Conn:
    source: str
    listener: str = "-"
    reclaim: Reclaimable | None = None
    sandboxes: list[str] = field(default_factory=list)
    # Flows fully received and not yet answered: the connection is waiting on the gateway or upstream.
    inflight: set[str] = field(default_factory=set)
    upgraded: bool = False
    closing: bool = False
    # Closed to make room for a new connection; counted in ConnectionLimits._reclaiming until gone.
    reclaimed: bool = False

    def reclaimable(self) -> bool:
        return not (self.closing or self.inflight or self.upgraded or self.sandboxes) and (
            self.reclaim is not None and self.reclaim.idle()
        )


class ConnectionTable:
    """Open guest connections by id: the unidentified ones per source and overall, oldest first,
    and the identified ones counted per sandbox."""

    def __init__(self) -> None:
        self.conns: dict[str, _Conn] = {}
        self.waiting: dict[str, OrderedDict[str, None]] = {}
        self.unidentified: OrderedDict[str, None] = OrderedDict()
        self.per_sandbox: dict[str, int] = {}

    @property
    def per_source(self) -> dict[str, int]:
        """Unidentified connections per source."""
        return {source: len(ids) for source, ids in self.waiting.items()}

    def waiting_from(self, source: str) -> int:
        ids = self.waiting.get(source)
        return len(ids) if ids else 0

    def add(
        self, client_id: str, source: str, *, listener: str = "-", reclaim: Reclaimable | None = None
    ) -> _Conn:
        conn = self.conns[client_id] = _Conn(source, listener, reclaim)
        self.waiting.setdefault(source, OrderedDict())[client_id] = None
        self.unidentified[client_id] = None
        return conn

    def attribute(self, client_id: str, sandbox: str, cap: int) -> bool:
        """Count the connection for `sandbox` (no longer for its source); False (and nothing
        changed) when that passes `cap`."""
        conn = self.conns.get(client_id)
        if conn is None or sandbox in conn.sandboxes:
            return True
        held = self.per_sandbox.get(sandbox, 0)
        if cap and held >= cap:
            return False
        conn.sandboxes.append(sandbox)
        self.per_sandbox[sandbox] = held + 1
        self._detach(client_id, conn)
        return True

    def oldest_idle(self, source: str | None, scan: int = RECLAIM_SCAN) -> str | None:
        """The oldest unidentified connection (of `source`, or of any) that is idle now, or None."""
        ids = self.unidentified if source is None else self.waiting.get(source)
        if not ids:
            return None
        for client_id in itertools.islice(ids, scan):
            if self.conns[client_id].reclaimable():
                return client_id
        return None

    def take(self, client_id: str) -> _Conn:
        """Mark the connection reclaimed: it counts for its source no more (it is closing)."""
        conn = self.conns[client_id]
        conn.closing = conn.reclaimed = True
        self._detach(client_id, conn)
        return conn

    def remove(self, client_id: str) -> _Conn | None:
        conn = self.conns.pop(client_id, None)
        if conn is None:
            return None
        self._detach(client_id, conn)
        for sandbox in conn.sandboxes:
            _decrement(self.per_sandbox, sandbox)
        return conn

    def _detach(self, client_id: str, conn: _Conn) -> None:
        """Take the connection out of the unidentified ones (identified, closing or gone)."""
        self.unidentified.pop(client_id, None)
        ids = self.waiting.get(conn.source)
        if ids is not None:
            ids.pop(client_id, None)
            if not ids:
                del self.waiting[conn.source]


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
