"""Keeps a gateway's copy of the fleet registry current, off the request path.

A subscriber on `<prefix>events` and a poll of `<prefix>version` (every `poll_interval`)
trigger a sync: the registry is read in one transaction, kept in memory, and the policy is
reloaded with it (the reloader builds the PolicySet in a worker thread and swaps it). The
request path reads only the in-memory PolicySet: zero redis round trips per request.

Losing redis (reported to sandgate.proxy.redis.outage, which logs it once): the last snapshot
keeps being served; once `max_staleness_seconds` pass
without a successful read, the redis-registered sandboxes are dropped (their requests get
`no_identity`) and restored by the first successful sync after redis answers again.

Redis replaced by an empty instance (flushed, rebuilt without persistence): the fleet
epoch, a random id set once per data set and remembered in `<state_dir>/fleet-epoch`, is
gone or different. The gateway logs `fleet.redis_replaced` (an error), counts it
(`sandgate_fleet_redis_replaced_total`) and adopts the new epoch; its sandboxes and stored
credentials are gone with the data (fail closed) until they are registered again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog
from redis.exceptions import RedisError

from sandgate.proxy.config import RedisConfig
from sandgate.proxy.fleet.channel import FleetKeys, ReloadReport, record_gateway
from sandgate.proxy.redis.client import connect
from sandgate.proxy.redis.outage import REDIS_OUTAGE
from sandgate.proxy.stores.protocols import StoreError
from sandgate.proxy.stores.registry import DynamicSandbox
from sandgate.proxy.stores.registry_redis import RedisSandboxStore
from sandgate.proxy.tasks import BackgroundTask

__all__ = ["FleetRegistrySync", "default_gateway_id"]

log = structlog.get_logger("sandgate.fleet")

BACKOFF_MIN, BACKOFF_MAX = 0.2, 5.0
HEARTBEAT_SECONDS = 10.0

Reload = Callable[[str], Awaitable[bool]]


def default_gateway_id(state_path: Path) -> str:
    """The host name, plus a digest of the state folder (two gateways on one host differ)."""
    digest = hashlib.sha256(str(state_path).encode()).hexdigest()[:6]
    return f"{socket.gethostname()}:{digest}"


class FleetRegistrySync:
    """The gateway's side of the fleet registry and reload channel."""

    def __init__(
        self,
        cfg: RedisConfig,
        gateway_id: str,
        reload: Reload,
        policy_version: Callable[[], str],
        *,
        poll_interval: float = 1.0,
        last_reload: Callable[[], ReloadReport | None] = lambda: None,
        epoch_file: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.gateway_id = gateway_id
        self.reload = reload
        self.policy_version = policy_version
        self.last_reload = last_reload
        self.poll_interval = poll_interval
        self.keys = FleetKeys.for_prefix(cfg.prefix)
        self.client = connect(cfg)
        self.store = RedisSandboxStore(self.client, self.keys)
        self.version: int | None = None
        self.stale = False
        # Whether the reload that dropped a stale snapshot's sandboxes has succeeded.
        self._dropped = False
        self._snapshot: tuple[DynamicSandbox, ...] = ()
        self._last_ok: float | None = None
        self._last_report = 0.0
        self._unreachable_logged = False
        self._lock = asyncio.Lock()
        self._tasks = (
            BackgroundTask("sandgate-fleet-subscribe", self._subscribe),
            BackgroundTask("sandgate-fleet-poll", self._poll),
        )
        self.epoch_file = epoch_file
        self.epoch: str | None = _read_epoch(epoch_file)
        self.replaced = 0

    def sandboxes(self) -> list[DynamicSandbox]:
        """What the next policy load merges: the snapshot, or nothing once it is too old."""
        return [] if self.stale else list(self._snapshot)

    async def start(self) -> None:
        """Read the registry once (a failure is logged; the tasks retry), then follow changes."""
        with contextlib.suppress(RedisError):
            await self._check_epoch(await self.client.get(self.keys.epoch))
        await self.sync("fleet_start")
        for task in self._tasks:
            task.start()

    async def stop(self) -> None:
        for task in self._tasks:
            await task.stop()
        with contextlib.suppress(Exception):
            await self.client.aclose()

    async def sync(self, trigger: str) -> bool:
        """Read the registry and reload when it (or the fleet version) changed; True on success."""
        async with self._lock:
            try:
                snap = await self.store.snapshot()
            except StoreError as e:
                await self._failed(e.args[0] if e.args else "StoreError")
                return False
            self._succeeded()
            changed = snap.version != self.version or self.stale or snap.sandboxes != self._snapshot
            if self.stale:
                log.warning("fleet.registry_restored", sandboxes=len(snap.sandboxes), version=snap.version)
            self._snapshot, self.version, self.stale = snap.sandboxes, snap.version, False
            self._dropped = False
            if changed:
                await self.reload(trigger)
            await self._report()
            return True

    async def _subscribe(self) -> None:
        backoff = BACKOFF_MIN
        while True:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.keys.events)
                backoff = BACKOFF_MIN
                # Whatever was published while we were not listening: the poll would catch it
                # within a second; a resubscription checks at once.
                await self.sync("fleet_resubscribe")
                while True:
                    message = await pubsub.get_message(timeout=self.poll_interval)
                    if message is None:
                        continue
                    # A burst of changes is one reload: drain what is already queued first.
                    while await pubsub.get_message(timeout=0.0) is not None:
                        pass
                    await self.sync("fleet_event")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("fleet.subscriber_lost", error=type(e).__name__, retry_in=backoff)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                await self._poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("fleet.poll_failed")

    async def _poll_once(self) -> None:
        try:
            raw, epoch = await self.client.mget(self.keys.version, self.keys.epoch)
        except RedisError as e:
            await self._failed(e)
            return
        await self._check_epoch(epoch)
        if self.stale or int(raw or 0) != self.version:
            # Only a registry read (sync) proves the snapshot current and resets the staleness clock.
            await self.sync("fleet_version")
            return
        self._succeeded()
        if time.monotonic() - self._last_report > HEARTBEAT_SECONDS:
            await self._report()

    def _succeeded(self) -> None:
        self._last_ok = time.monotonic()
        REDIS_OUTAGE.reached("fleet.registry")
        if self._unreachable_logged:
            log.warning("fleet.redis_reachable")
            self._unreachable_logged = False

    async def _failed(self, error: BaseException | str) -> None:
        """Redis did not answer: keep the snapshot until it is too old, then drop it (once)."""
        now = time.monotonic()
        REDIS_OUTAGE.failed("fleet.registry", error)
        if not self._unreachable_logged:
            # What the registry does about it (the outage itself is logged by REDIS_OUTAGE).
            log.error("fleet.redis_unreachable", snapshot_sandboxes=len(self._snapshot), version=self.version)
            self._unreachable_logged = True
        since = now - self._last_ok if self._last_ok is not None else None
        if self._dropped or (since is not None and since < self.cfg.max_staleness_seconds):
            return
        if not self.stale:
            log.error(
                "fleet.registry_stale",
                dropped_sandboxes=len(self._snapshot),
                seconds_without_redis=round(since, 1) if since is not None else None,
                max_staleness_seconds=self.cfg.max_staleness_seconds,
            )
        self.stale = True
        # Until the reload that drops them succeeds, try again on every failed poll.
        self._dropped = not self._snapshot or await self.reload("fleet_stale")

    async def _check_epoch(self, current: bytes | str | None) -> None:
        """Compare redis's fleet epoch with the one this gateway knew; create it in a new fleet."""
        found = current.decode() if isinstance(current, bytes) else current
        if found is not None and found == self.epoch:
            return
        if found is None:
            # First gateway of a new fleet, or the data set is gone: start a new epoch (one wins).
            await self.client.set(self.keys.epoch, secrets.token_hex(8), nx=True)
            raw = await self.client.get(self.keys.epoch)
            found = raw.decode() if isinstance(raw, bytes) else raw
            if found is None:
                return
        if self.epoch is not None:
            self.replaced += 1
            log.error(
                "fleet.redis_replaced",
                known_epoch=self.epoch,
                found_epoch=found if current is not None else None,
                consequence="sandboxes registered in redis and stored credentials are gone: "
                "register them again (see docs/operations/fleet.md, Recovering)",
            )
        self.epoch = found
        if self.epoch_file is not None:
            await asyncio.to_thread(_write_epoch, self.epoch_file, found)

    async def _report(self) -> None:
        self._last_report = time.monotonic()
        try:
            await record_gateway(
                self.client,
                self.keys,
                self.gateway_id,
                fleet_version=self.version,
                policy_version=self.policy_version(),
                stale=self.stale,
                reload=self.last_reload(),
            )
        except RedisError as e:
            REDIS_OUTAGE.failed("fleet.registry", e)
            log.warning("fleet.report_failed", error=type(e).__name__)


def _read_epoch(path: Path | None) -> str | None:
    """The epoch this gateway last saw (kept across restarts), or None."""
    if path is None:
        return None
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _write_epoch(path: Path, epoch: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(epoch + "\n")
    tmp.replace(path)
