"""The gateway's grants that are not in a tenant's grants file: each sandbox's (scope `sandbox`)
and, with `redis:` configured, the tenants' too (scope `tenant`), so every gateway of the fleet
has them.

Where they are kept: one JSON file in the gateway's state folder (`grants.json`, shared by its
workers; only the lead writes it, atomically), or a redis hash (`<prefix>grants`) with a change
counter (`<prefix>grants:version`). Either survives a restart.

Every worker decides with an in-memory snapshot (sandgate.policy.model.grants.Grants): zero
I/O per request. A worker reads the store again when its change token moves (looked at every
REFRESH_SECONDS, and at once when the lead says so after a change), so a grant is in force on
the lead before the approval answers, on its peers once they confirmed, and on the other
gateways of a fleet within about REFRESH_SECONDS. Expiry is enforced at every decision (an
expired grant allows nothing); the lead's sweep then removes it and records that it expired.
A store that cannot be read keeps the last snapshot for STALE_SECONDS (a redis blip does not
take grants away; the expiry check still applies), then drops it: a grant revoked meanwhile
must not go on allowing for as long as redis stays away (fail closed: asks again).

A counted grant's (`max_uses`) uses are counted beside the store (sandgate.proxy.approvals.
uses: redis, or the state folder), the tenants' grants files' grants too; every snapshot a
worker publishes carries the count (Grants.uses), and decide takes a use of the grant that
allowed a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from sandgate.policy.model.grants import Grant, Grants
from sandgate.proxy.approvals.uses import CountedUses, RedisUseCount, StateFileUseCount, UseCount
from sandgate.proxy.redis.outage import REDIS_OUTAGE
from sandgate.proxy.tasks import BackgroundTask

__all__ = [
    "REFRESH_SECONDS",
    "STALE_SECONDS",
    "GrantBook",
    "GrantStore",
    "GrantStoreError",
    "RedisGrants",
    "StateFileGrants",
    "grant_record",
    "use_count_for",
]

log = structlog.get_logger("sandgate.grants")

REFRESH_SECONDS = 0.5
# How long a snapshot outlives a store that cannot be read.
STALE_SECONDS = 30.0
SWEEP_SECONDS = 1.0

Emit = Callable[[dict[str, Any]], Awaitable[bool]]


class GrantStoreError(Exception):
    """The grants store could not be read or written (redis unreachable, a disk error)."""


class GrantStore(Protocol):
    """Where a gateway's grants are kept."""

    where: str

    async def token(self) -> object:
        """A value that changes whenever the grants do (cheap: looked at twice a second)."""
        ...

    async def load(self) -> list[Grant]: ...

    async def add(self, grant: Grant) -> None: ...

    async def remove(self, grant_id: str) -> Grant | None:
        """Remove a grant; the grant when this call removed it (None: it was not there)."""
        ...


class StateFileGrants:
    """Grants in a JSON file of the gateway's state folder; the lead is its only writer."""

    where = "state"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = asyncio.Lock()

    async def token(self) -> object:
        try:
            st = await asyncio.to_thread(os.stat, self.path)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise GrantStoreError(f"{self.path}: {e.strerror}") from None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    async def load(self) -> list[Grant]:
        return await asyncio.to_thread(self._read)

    async def add(self, grant: Grant) -> None:
        async with self._lock:
            grants = [g for g in await asyncio.to_thread(self._read) if g.id != grant.id]
            await asyncio.to_thread(self._write, [*grants, grant])

    async def remove(self, grant_id: str) -> Grant | None:
        async with self._lock:
            grants = await asyncio.to_thread(self._read)
            found = next((g for g in grants if g.id == grant_id), None)
            if found is not None:
                await asyncio.to_thread(self._write, [g for g in grants if g.id != grant_id])
            return found

    def _read(self) -> list[Grant]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:
            raise GrantStoreError(f"{self.path}: cannot be read ({e})") from None
        return _parse_all(data.get("grants") if isinstance(data, dict) else None, self.where)

    def _write(self, grants: list[Grant]) -> None:
        text = json.dumps({"grants": [g.as_json() for g in grants]}, indent=1, sort_keys=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd, temp = tempfile.mkstemp(prefix=".grants.", suffix=".tmp", dir=self.path.parent)
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(temp, 0o600)
            os.replace(temp, self.path)
        except OSError as e:
            raise GrantStoreError(f"{self.path}: cannot be written ({e.strerror})") from None


class RedisGrants:
    """Grants in a redis hash (id → JSON) beside a change counter, shared by the fleet."""

    where = "redis"

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.key = f"{prefix}grants"
        self.version_key = f"{prefix}grants:version"

    async def token(self) -> object:
        try:
            with REDIS_OUTAGE.track("grants"):
                return await self.client.get(self.version_key)
        except (RedisError, OSError) as e:
            raise GrantStoreError(f"redis: {type(e).__name__}") from None

    async def load(self) -> list[Grant]:
        try:
            with REDIS_OUTAGE.track("grants"):
                raw = await self.client.hgetall(self.key)
        except (RedisError, OSError) as e:
            raise GrantStoreError(f"redis: {type(e).__name__}") from None
        entries = []
        for value in raw.values():
            try:
                entries.append(json.loads(value))
            except ValueError:
                log.warning("grants.malformed_entry", where="redis")
        return _parse_all(entries, self.where)

    async def add(self, grant: Grant) -> None:
        try:
            with REDIS_OUTAGE.track("grants"):
                async with self.client.pipeline(transaction=True) as pipe:
                    pipe.hset(self.key, grant.id, json.dumps(grant.as_json()))
                    pipe.incr(self.version_key)
                    await pipe.execute()
        except (RedisError, OSError) as e:
            raise GrantStoreError(f"redis: {type(e).__name__}") from None

    async def remove(self, grant_id: str) -> Grant | None:
        try:
            with REDIS_OUTAGE.track("grants"):
                async with self.client.pipeline(transaction=True) as pipe:
                    pipe.hget(self.key, grant_id)
                    pipe.hdel(self.key, grant_id)
                    pipe.incr(self.version_key)
                    value, removed, _ = await pipe.execute()
        except (RedisError, OSError) as e:
            raise GrantStoreError(f"redis: {type(e).__name__}") from None
        if not removed or value is None:
            return None  # another gateway removed it first (and recorded it)
        try:
            return Grant.from_json(json.loads(value), self.where)
        except (ValueError, KeyError, TypeError):
            return None


def _parse_all(entries: object, origin: str) -> list[Grant]:
    out = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            out.append(Grant.from_json(entry, origin))
        except (ValueError, KeyError, TypeError):
            log.warning("grants.malformed_entry", where=origin)
    return out


def use_count_for(store: GrantStore) -> UseCount:
    """Where a store's grants' uses are counted: beside it (redis, or the state folder)."""
    if isinstance(store, RedisGrants):
        return RedisUseCount(store.client, store.key.removesuffix("grants"))
    if isinstance(store, StateFileGrants):
        return StateFileUseCount(store.path.parent / "grant-uses")
    raise TypeError(f"no use count for a {type(store).__name__}: pass one")


def grant_record(
    grant: Grant, action: str, *, where: str, by: str | None, uses: int | None = None
) -> dict[str, Any]:
    """The audit record of a grant made, expired, revoked or exhausted (`by`: who did it),
    tied to its approval by id; a counted grant's carries its max_uses (and `uses`, the uses
    taken, when known)."""
    counted: dict[str, Any] = {}
    if grant.max_uses is not None:
        counted = {"max_uses": grant.max_uses, **({"uses": uses} if uses is not None else {})}
    return {
        "event": "grant",
        "time": time.time(),
        "action": action,
        "approval_id": grant.id,
        "rule_id": grant.rule_id,
        "scope": grant.scope,
        "tenant": grant.tenant,
        "sandbox": grant.sandbox,
        "dest": {"host": grant.host, "port": grant.port},
        "methods": sorted(grant.methods) if grant.methods is not None else None,
        "paths": list(grant.paths) if grant.paths is not None else None,
        "expires": grant.expires,
        "by": by,
        "approved_by": grant.by,
        "reason": grant.reason,
        "where": where,
        # A tool grant's tool, arguments' digest and predicates (the operator's, never a call's values).
        **grant.tool_fields(),
        **counted,
    }


class GrantBook:
    """One worker's view of the gateway's grants, and (on the lead) the changes to them."""

    def __init__(
        self,
        store: GrantStore,
        publish: Callable[[Grants], None],
        emit: Emit,
        *,
        sweep: bool,
        refresh_seconds: float = REFRESH_SECONDS,
        default_ttl: float = 3600.0,
        max_ttl: float = 7 * 86_400.0,
        uses: UseCount | None = None,
    ) -> None:
        self.store = store
        # Puts a new snapshot in force (GatewayContext.grants: one assignment).
        self.publish = publish
        self.emit = emit
        count = uses if uses is not None else use_count_for(store)
        # Counted grants' uses (this store's and the grants files'), shared by every worker.
        self.uses = CountedUses(
            count, emit, lambda g, n: grant_record(g, "exhausted", where=count.where, by=None, uses=n)
        )
        self.grants: Grants = Grants((), uses=self.uses)
        publish(self.grants)
        self.refresh_seconds = refresh_seconds
        # A sandbox grant's TTL when the approval names none, and the cap on any grant's.
        self.default_ttl = default_ttl
        self.max_ttl = max_ttl
        # The lead sweeps expired grants (and records it); its peers only read.
        self.sweeps = sweep
        # The lead's sweep of the tenants' grants files too (set with the admin state).
        self.sweep_files: Callable[[], Awaitable[object]] | None = None
        self._token: object = object()
        self._read_at = time.monotonic()
        self._task = BackgroundTask("sandgate-grants", self._run)
        self._last_sweep = 0.0

    async def start(self) -> None:
        with contextlib.suppress(GrantStoreError):
            await self.refresh(force=True)
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def refresh(self, *, force: bool = False) -> bool:
        """Read the store again when it changed (or `force`); True when the snapshot changed."""
        token = await self.store.token()
        if not force and token == self._token:
            self._read_at = time.monotonic()
            return False
        grants = Grants(await self.store.load(), uses=self.uses)
        self._read_at = time.monotonic()
        self._token = token
        self.grants = grants
        self.publish(grants)
        return True

    def unreadable(self, now: float) -> bool:
        """The store could not be read at `now`: past STALE_SECONDS since the last read, drop the
        snapshot (True when this call dropped it); the next read that works loads it again."""
        if now - self._read_at < STALE_SECONDS or not len(self.grants):
            return False
        log.error("grants.dropped_stale", seconds=round(now - self._read_at), grants=len(self.grants))
        self._token = object()
        self.grants = Grants((), uses=self.uses)
        self.publish(self.grants)
        return True

    async def add(self, grant: Grant) -> None:
        """Store a grant and put it in force here; GrantStoreError when it could not be stored."""
        await self.store.add(grant)
        await self.refresh(force=True)
        await self.emit(grant_record(grant, "made", where=self.store.where, by=grant.by))
        log.info("grant.made", id=grant.id, scope=grant.scope, tenant=grant.tenant, sandbox=grant.sandbox)

    async def revoke(self, grant_id: str, by: str | None) -> Grant | None:
        """Remove a grant; the grant when it was here."""
        removed = await self.store.remove(grant_id)
        await self.refresh(force=True)
        if removed is not None:
            await self.emit(grant_record(removed, "revoked", where=self.store.where, by=by))
            await self.uses.forget(removed)
        return removed

    async def sweep(self, now: float | None = None) -> list[Grant]:
        """Remove the expired grants (they allow nothing already); those this call removed."""
        at = time.time() if now is None else now
        gone = []
        for g in self.grants:
            if g.live(at):
                continue
            removed = await self.store.remove(g.id)
            if removed is not None:
                gone.append(removed)
                await self.emit(grant_record(removed, "expired", where=self.store.where, by=None))
                await self.uses.forget(removed)
        if gone:
            await self.refresh(force=True)
        return gone

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_seconds)
            try:
                await self.refresh()
                if self.sweeps and time.monotonic() - self._last_sweep >= SWEEP_SECONDS:
                    self._last_sweep = time.monotonic()
                    await self.sweep()
                    if self.sweep_files is not None:
                        await self.sweep_files()
            except GrantStoreError as e:
                log.warning("grants.store_unavailable", error=str(e))
                self.unreadable(time.monotonic())
            except Exception:
                # A sweep that failed is tried again; expired grants allow nothing meanwhile.
                # A read that failed so (not as GrantStoreError) ages the snapshot all the same.
                log.exception("grants.sweep_failed")
                self.unreadable(time.monotonic())
