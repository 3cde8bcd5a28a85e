"""Share rate-limit counts with the other processes of a fleet (its redis) or, without redis,
of one gateway (its workers' limit relay, proxy/workers/limit_relay.py), off the request path.

Every `interval` seconds (and before the first decisions on a sandbox new here) one pipelined round trip adds
this gateway's unsynced counts to the per-window fleet keys (INCRBY, with an expiry of two
windows) and reads the totals back; the Limiter then refuses on its own count plus the rest
of the fleet's last known count. When
redis is unreachable the gateway keeps enforcing on its local counts and the last known
fleet totals (logged once per outage), and takes only its share of what remains: the
remainder divided by the number of gateways it last saw alive (each gateway marks itself
in `<prefix>limits:gateways` about once a second); unsynced counts are sent when redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import redis.asyncio as aioredis
import structlog

from sandgate.policy.limiter import Limiter, SyncItem
from sandgate.policy.model.tenant import Limits
from sandgate.proxy.config import RedisConfig
from sandgate.proxy.redis.client import Keys, connect
from sandgate.proxy.redis.outage import RedisOutage
from sandgate.proxy.tasks import BackgroundTask
from sandgate.proxy.worker_role import WorkerRole

__all__ = ["RELAY_ENV", "RELAY_PREFIX", "LimitSync", "relay_limit_sync", "relay_url_from_env"]

log = structlog.get_logger("sandgate.limits")

# Set by the supervisor in each worker's environment: the limit relay's URL (unix:///...).
RELAY_ENV = "SANDGATE_LIMIT_RELAY"
# Key prefix of the counts shared through the relay (the fleet's default is "sandgate:").
RELAY_PREFIX = "sandgate:local:"
# The relay's failures and recoveries (another server than the fleet's `redis:`).
RELAY_OUTAGE = RedisOutage("limit_relay")

# Keys outlive their window long enough for the next window's sliding estimate, plus slack.
_EXPIRY_SLACK_SECONDS = 60
_REFRESH_ALL_SECONDS = 1.0
# A gateway that has not marked itself for this long is no longer counted as alive.
_PRESENCE_SECONDS = 10.0


class LimitSync:
    """The background task that merges this gateway's limit counters with the fleet's."""

    def __init__(
        self,
        limiter: Limiter,
        client: aioredis.Redis,
        keys: Keys,
        interval: float,
        gateway_id: str = "",
        *,
        outage: RedisOutage,
    ) -> None:
        self.limiter = limiter
        self.client = client
        # Told of each round trip's outcome: the fleet's redis, or the workers' limit relay.
        self.outage = outage
        self.keys = keys
        self.interval = interval
        self.gateway_id = gateway_id
        # Gateways (this one included) seen marking themselves alive at the last refresh.
        self.gateways_seen = 1
        self.healthy = True
        self._ticks = 0
        self._task = BackgroundTask("sandgate-limit-sync", self._run)
        # Sandboxes whose first sync here is under way: their other requests wait for it too.
        self._learning: dict[tuple[str, str], asyncio.Event] = {}
        # One sync at a time: the background tick and a first request's warm-up.
        self._lock = asyncio.Lock()

    def key(self, item: SyncItem) -> str:
        k = item.key
        return self.keys("limits", k.scope, k.name, k.kind.value, str(item.index))

    async def learn(self, tenant: str, sandbox: str, limits: Limits | None) -> None:
        """Before the decisions on a sandbox new here: learn the fleet's counts with one sync.
        Requests that arrive while it runs wait for the same sync (none is decided blind).
        Bounded by the redis timeout; skipped while redis is known down (the local view decides)."""
        key = (tenant, sandbox)
        running = self._learning.get(key)
        if running is not None:
            await running.wait()
            return
        if not self.limiter.prepare(tenant, sandbox, limits) or not self.healthy:
            return
        done = self._learning[key] = asyncio.Event()
        try:
            await self.sync_once()
        finally:
            done.set()
            del self._learning[key]

    async def sync_once(self) -> bool:
        """One round trip: push deltas, merge fleet totals. False (and logged) when redis failed."""
        async with self._lock:
            return await self._sync_once()

    async def _sync_once(self) -> bool:
        # Counters in use sync every tick; idle ones about once a second (they decide nothing
        # now), when this gateway also marks itself alive and counts who else is.
        self._ticks += 1
        refresh = self._ticks * self.interval >= _REFRESH_ALL_SECONDS
        if refresh:
            self._ticks = 0
        items = self.limiter.pending(refresh_all=refresh)
        if not items and not refresh:
            return True
        presence = self.keys("limits", "gateways")
        try:
            pipe = self.client.pipeline(transaction=False)
            for item in items:
                key = self.key(item)
                pipe.incrby(key, item.delta)
                pipe.expire(key, int(2 * item.key.kind.window) + _EXPIRY_SLACK_SECONDS)
            if refresh:
                now = time.time()
                pipe.zadd(presence, {self.gateway_id: now})
                pipe.zremrangebyscore(presence, "-inf", now - _PRESENCE_SECONDS)
                pipe.zcard(presence)
            results = await pipe.execute()
        except Exception as e:  # redis down, timeout, protocol error: keep the local view
            self.outage.failed("limits", e)
            self.limiter.outage_peers = max(0, self.gateways_seen - 1)
            if self.healthy:
                log.warning(
                    "limits.fleet_sync_failed",
                    error=type(e).__name__,
                    enforcing="local counts plus the last known fleet totals, this gateway's share",
                    gateways_seen=self.gateways_seen,
                )
            self.healthy = False
            return False
        for item, total in zip(items, results[: 2 * len(items) : 2], strict=True):
            self.limiter.merge(item, int(total))
        if refresh:
            self.gateways_seen = max(1, int(results[-1]))
        self.limiter.outage_peers = 0
        self.outage.reached("limits")
        if not self.healthy:
            log.info("limits.fleet_sync_restored")
        self.healthy = True
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.sync_once()
            except Exception:
                log.exception("limits.fleet_sync_crashed")

    async def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        """Stop the task, push what is left (best effort) and close the client."""
        await self._task.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.sync_once(), timeout=1.0)
        with contextlib.suppress(Exception):
            await self.client.aclose()


def relay_url_from_env() -> str | None:
    """The limit relay's URL the supervisor gave this worker, or None."""
    return os.environ.get(RELAY_ENV) or None


def relay_limit_sync(limiter: Limiter, interval: float, role: WorkerRole) -> LimitSync | None:
    """For worker i of several (without `redis:`): the fleet's LimitSync against the workers'
    limit relay, as member `w<i>`; None for a process that is the whole gateway."""
    url = relay_url_from_env()
    if role.count <= 1:
        return None
    if url is None:
        log.warning("limits.per_worker", reason=f"{RELAY_ENV} is not set: each worker counts on its own")
        return None
    cfg = RedisConfig(url=url, prefix=RELAY_PREFIX)
    return LimitSync(
        limiter, connect(cfg), Keys(cfg.prefix), interval, gateway_id=f"w{role.index}", outage=RELAY_OUTAGE
    )
