"""Rate and size limits: sliding-window counters, this gateway's counts plus the fleet's.

Each counter keeps whole counts for fixed windows (a minute, an hour) aligned on wall-clock
time, so every gateway of a fleet agrees on which window a moment belongs to, and estimates
the sliding window as `previous * (1 - elapsed fraction) + current` (O(1), no timestamps).
A counter holds this gateway's counts and the last known total of the rest of the fleet;
a sync task (sandgate.proxy.fleet.limits_sync) pushes the gateway's unsynced counts and merges the
fleet totals back. Deciding never does I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from sandgate.policy.model.tenant import Limits
from sandgate.policy.reasons import Reason

__all__ = ["CounterKey", "Kind", "LimitExceeded", "Limiter", "SyncItem", "WindowCounter"]

MINUTE = 60.0
HOUR = 3600.0


class Kind(StrEnum):
    """What a counter counts, and over which window."""

    REQUESTS = "requests"
    EGRESS_BYTES = "egress_bytes"

    @property
    def window(self) -> float:
        return MINUTE if self is Kind.REQUESTS else HOUR


@dataclass(frozen=True, slots=True)
class CounterKey:
    """One counter: a sandbox's (`tenant/sandbox`) or a whole tenant's, of one kind."""

    scope: str
    name: str
    kind: Kind


@dataclass(frozen=True, slots=True)
class LimitExceeded:
    """A refusal: the reason code, which limit, and when to try again (seconds)."""

    reason: Reason
    limit: str
    retry_after: int = 1


@dataclass(frozen=True, slots=True)
class SyncItem:
    """Unsynced counts of one counter in one window: `delta` to add to the fleet total."""

    key: CounterKey
    index: int
    delta: int


@dataclass(slots=True)
class WindowCounter:
    """Counts for the current and the previous window: this gateway's and the fleet's others."""

    window: float
    index: int = 0
    mine: int = 0
    mine_prev: int = 0
    # Of `mine`, how much the fleet total already includes.
    pushed: int = 0
    pushed_prev: int = 0
    # The rest of the fleet (last known total minus what this gateway pushed).
    others: int = 0
    others_prev: int = 0
    touched: bool = field(default=False)
    # New here: the next sync also reads the previous window's fleet total, which a gateway
    # that met this sandbox after a window boundary would otherwise never learn.
    fresh: bool = field(default=False)

    def roll(self, now: float) -> None:
        """Move to the window `now` falls in."""
        index = int(now // self.window)
        if index == self.index:
            return
        if index == self.index + 1:
            self.mine_prev, self.pushed_prev, self.others_prev = self.mine, self.pushed, self.others
        else:
            self.mine_prev = self.pushed_prev = self.others_prev = 0
        self.index, self.mine, self.pushed, self.others = index, 0, 0, 0

    def estimate(self, now: float, peers: int = 0) -> float:
        """The sliding-window count at `now`: the previous window weighted by how much still overlaps.

        `peers`: other gateways presumed to admit as much as this one has not yet pushed to the
        fleet (while redis is down), so each takes only its share of what remains.
        """
        self.roll(now)
        overlap = 1.0 - (now % self.window) / self.window
        previous = self.mine_prev + self.others_prev + peers * (self.mine_prev - self.pushed_prev)
        return previous * overlap + self.mine + self.others + peers * (self.mine - self.pushed)

    def add(self, now: float, amount: int) -> None:
        self.roll(now)
        self.mine += amount
        self.touched = True

    def retry_after(self, now: float, limit: int, cost: int) -> int:
        """Whole seconds until `cost` more fits under `limit` (assuming nothing else is counted)."""
        self.roll(now)
        elapsed = now % self.window
        current = self.mine + self.others
        previous = self.mine_prev + self.others_prev
        if cost > limit:
            wait = 2 * self.window - elapsed
        elif current + cost > limit:
            # Wait for the next window, then for this window's weight to fall far enough.
            wait = self.window - elapsed + self.window * max(0.0, 1 - (limit - cost) / current)
        elif previous > 0:
            wait = self.window * max(0.0, 1 - (limit - cost - current) / previous) - elapsed
        else:
            wait = 0.0
        return max(1, math.ceil(wait))

    def pending(self, refresh: bool = False) -> list[tuple[int, int]]:
        """(window index, unsynced count) worth sending: changed, used since the last sync, new
        here, or `refresh` (which also re-reads the previous window's total, still weighed)."""
        out = []
        if self.mine_prev > self.pushed_prev or self.fresh or refresh:
            out.append((self.index - 1, self.mine_prev - self.pushed_prev))
        if self.mine > self.pushed or self.touched or refresh:
            out.append((self.index, self.mine - self.pushed))
        self.touched = self.fresh = False
        return out

    def merge(self, index: int, delta: int, fleet_total: int) -> None:
        """Record that `delta` reached the fleet total of window `index`, now `fleet_total`."""
        if index == self.index:
            self.pushed += delta
            self.others = max(0, fleet_total - self.pushed)
        elif index == self.index - 1:
            self.pushed_prev += delta
            self.others_prev = max(0, fleet_total - self.pushed_prev)


class Limiter:
    """Every active sandbox's and tenant's counters; `admit` and `add_egress` are O(1), no I/O.

    Requests count against `requests_per_minute` (sandbox) and `tenant_requests_per_minute`;
    bytes against `egress_bytes_per_hour` and `tenant_egress_bytes_per_hour`. A request is
    refused when one more would pass a request limit, or when a byte limit is already used up.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.counters: dict[CounterKey, WindowCounter] = {}
        # While the fleet sync fails: how many other gateways were last seen alive. Each of
        # them is presumed to admit what this one admits, so this one takes 1/(peers+1) of
        # the remaining allowance (0: alone, or in sync).
        self.outage_peers = 0

    def admit(
        self,
        tenant: str,
        sandbox: str,
        limits: Limits | None,
        *,
        body_bytes: int | None = None,
        egress_bytes: int = 0,
    ) -> LimitExceeded | None:
        """Count one request (or new tunnel) and its known bytes if every limit lets it through.

        A request needs room for itself under each request limit, and for its known bytes
        (at least one) under each byte limit; otherwise nothing is counted and the refusal says why.
        """
        if limits is None:
            return None
        body_limit = limits.request_body_bytes
        if body_limit is not None and body_bytes is not None and body_bytes > body_limit:
            return LimitExceeded(Reason.BODY_TOO_LARGE, "request_body_bytes")
        now = self.clock()
        requests = self._checks(tenant, sandbox, limits, Kind.REQUESTS)
        egress = self._checks(tenant, sandbox, limits, Kind.EGRESS_BYTES)
        cost = max(1, egress_bytes)
        # In an outage every peer is presumed to admit this request's like too.
        share = 1 + self.outage_peers
        peers = self.outage_peers
        for name, counter, limit in requests:
            if counter.estimate(now, peers) + share > limit:
                return LimitExceeded(Reason.RATE_LIMITED, name, counter.retry_after(now, limit, 1))
        for name, counter, limit in egress:
            if counter.estimate(now, peers) + cost * share > limit:
                return LimitExceeded(Reason.RATE_LIMITED, name, counter.retry_after(now, limit, cost))
        for _, counter, _ in requests:
            counter.add(now, 1)
        if egress_bytes > 0:
            for _, counter, _ in egress:
                counter.add(now, egress_bytes)
        return None

    def prepare(self, tenant: str, sandbox: str, limits: Limits | None) -> bool:
        """Make the counters `admit` will use; True when one is new here, so a fleet gateway
        learns the others' count (one sync) before it decides on a sandbox it has not seen."""
        if limits is None:
            return False
        before = len(self.counters)
        checks = [
            *self._checks(tenant, sandbox, limits, Kind.REQUESTS),
            *self._checks(tenant, sandbox, limits, Kind.EGRESS_BYTES),
        ]
        if len(self.counters) == before:
            return False
        for _, counter, _ in checks:
            # Sent (with a zero delta) by the next sync, which reads both windows' totals.
            counter.touched = counter.fresh = True
        return True

    def add_egress(
        self, tenant: str, sandbox: str, limits: Limits | None, nbytes: int
    ) -> LimitExceeded | None:
        """Count bytes sent upstream; the refusal when that passed a byte limit (cut the stream)."""
        if limits is None or nbytes <= 0:
            return None
        now = self.clock()
        exceeded = None
        for name, counter, limit in self._checks(tenant, sandbox, limits, Kind.EGRESS_BYTES):
            counter.add(now, nbytes)
            if exceeded is None and counter.estimate(now, self.outage_peers) > limit:
                exceeded = LimitExceeded(Reason.RATE_LIMITED, name, counter.retry_after(now, limit, 1))
        return exceeded

    def used(self, tenant: str, sandbox: str, limits: Limits | None) -> list[tuple[str, float, int]]:
        """How much of each request and byte limit that applies to the sandbox (its own, then
        its tenant's) is used now: (limit name, sliding-window estimate, limit). Read only: a
        counter not made yet counts 0."""
        if limits is None:
            return []
        now = self.clock()
        out = []
        for kind in Kind:
            for name, key, limit in _limit_keys(tenant, sandbox, limits, kind):
                counter = self.counters.get(key)
                out.append((name, counter.estimate(now, self.outage_peers) if counter else 0.0, limit))
        return out

    def _checks(
        self, tenant: str, sandbox: str, limits: Limits, kind: Kind
    ) -> list[tuple[str, WindowCounter, int]]:
        return [
            (name, self._counter(key), limit)
            for name, key, limit in _limit_keys(tenant, sandbox, limits, kind)
        ]

    def _counter(self, key: CounterKey) -> WindowCounter:
        counter = self.counters.get(key)
        if counter is None:
            counter = self.counters[key] = WindowCounter(key.kind.window)
            counter.roll(self.clock())
        return counter

    def pending(self, refresh_all: bool = False) -> list[SyncItem]:
        """What the next sync sends; counters idle for two windows are dropped.

        Counters used since the last sync are always included (a zero delta reads the fleet
        total); with `refresh_all`, every live counter is, so idle ones learn the fleet's too.
        """
        now = self.clock()
        items: list[SyncItem] = []
        for key, counter in list(self.counters.items()):
            counter.roll(now)
            idle = counter.mine == counter.mine_prev == counter.others == counter.others_prev == 0
            if idle and not counter.touched:
                del self.counters[key]
                continue
            items.extend(SyncItem(key, index, delta) for index, delta in counter.pending(refresh_all))
        return items

    def merge(self, item: SyncItem, fleet_total: int) -> None:
        """Apply one sync answer (the counter may have rolled on since; then it is ignored)."""
        counter = self.counters.get(item.key)
        if counter is not None:
            counter.roll(self.clock())
            counter.merge(item.index, item.delta, fleet_total)


def _limit_keys(tenant: str, sandbox: str, limits: Limits, kind: Kind) -> list[tuple[str, CounterKey, int]]:
    """The limits of `kind` that apply to one sandbox: (name, its counter's key, the limit)."""
    if kind is Kind.REQUESTS:
        per_sandbox, per_tenant = limits.requests_per_minute, limits.tenant_requests_per_minute
        names = ("requests_per_minute", "tenant_requests_per_minute")
    else:
        per_sandbox, per_tenant = limits.egress_bytes_per_hour, limits.tenant_egress_bytes_per_hour
        names = ("egress_bytes_per_hour", "tenant_egress_bytes_per_hour")
    out = []
    if per_sandbox is not None:
        out.append((names[0], CounterKey("sandbox", f"{tenant}/{sandbox}", kind), per_sandbox))
    if per_tenant is not None:
        out.append((names[1], CounterKey("tenant", tenant, kind), per_tenant))
    return out
