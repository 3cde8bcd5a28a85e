"""The uses of counted grants (`max_uses`): how many requests each has let through, counted
where every worker and gateway that decides with the grant sees the same count.

- With redis (a fleet): one key per grant (`<prefix>grants:uses:<id>`), taken by a small Lua
  script that compares and increments in one step, so two workers (or gateways) can never
  both take the last use. The key expires a day after the grant does.
- Without redis: one file per grant in the gateway's state folder (`grant-uses/<id>`), read
  and written under an exclusive lock (flock), shared by the gateway's workers and kept across
  restarts. Grants from a tenant's grants file are counted here too.

Fail closed: a count that cannot be reached (redis down, a disk error) takes no use, and the
request is decided as without the grant (asked again, or denied); a grant without `max_uses`
is never counted and behaves as ever. The worker that takes the last use records, once, that
the grant is exhausted (a `grant` record with action `exhausted`).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from sandgate.policy.model.grants import Grant
from sandgate.proxy.redis.outage import REDIS_OUTAGE

__all__ = ["CountedUses", "RedisUseCount", "StateFileUseCount", "UseCount", "UseCountError"]

log = structlog.get_logger("sandgate.grants")

# How long a grant's count outlives the grant's expiry in redis (seconds).
KEEP_AFTER_EXPIRY = 86_400

Emit = Callable[[dict[str, Any]], Awaitable[bool]]
# The record of a grant's end (sandgate.proxy.approvals.grants.grant_record).
Record = Callable[[Grant, int], dict[str, Any]]


class UseCountError(Exception):
    """The count of a grant's uses could not be reached (redis unreachable, a disk error)."""


class UseCount(Protocol):
    """Where the uses are counted."""

    where: str

    async def take(self, grant: Grant) -> int | None:
        """Take one use: the count with it (1..max_uses), or None when none was left;
        UseCountError when the count cannot be reached."""
        ...

    async def used(self, grant_ids: Iterable[str]) -> dict[str, int]:
        """The uses taken so far, by grant id (0 for one never used); UseCountError."""
        ...

    async def forget(self, grant_id: str) -> None:
        """Drop a grant's count (it was revoked or swept)."""
        ...


# KEYS[1]: the count; ARGV: max_uses, the epoch second it may be dropped at (0: never).
_TAKE = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n >= tonumber(ARGV[1]) then return -1 end
n = redis.call('INCR', KEYS[1])
if tonumber(ARGV[2]) > 0 then redis.call('EXPIREAT', KEYS[1], ARGV[2]) end
return n
"""


class RedisUseCount:
    """Counts in redis, shared by every gateway of the fleet."""

    where = "redis"

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = f"{prefix}grants:uses:"
        self._take = client.register_script(_TAKE)

    async def take(self, grant: Grant) -> int | None:
        assert grant.max_uses is not None
        drop_at = int(grant.expires) + KEEP_AFTER_EXPIRY if grant.expires is not None else 0
        try:
            with REDIS_OUTAGE.track("grant_uses"):
                n = int(await self._take(keys=[self.prefix + grant.id], args=[grant.max_uses, drop_at]))
        except (RedisError, OSError) as e:
            raise UseCountError(f"redis: {type(e).__name__}") from None
        return None if n < 0 else n

    async def used(self, grant_ids: Iterable[str]) -> dict[str, int]:
        ids = list(grant_ids)
        if not ids:
            return {}
        try:
            with REDIS_OUTAGE.track("grant_uses"):
                values = await self.client.mget([self.prefix + i for i in ids])
        except (RedisError, OSError) as e:
            raise UseCountError(f"redis: {type(e).__name__}") from None
        return {i: int(v or 0) for i, v in zip(ids, values, strict=True)}

    async def forget(self, grant_id: str) -> None:
        try:
            with REDIS_OUTAGE.track("grant_uses"):
                await self.client.delete(self.prefix + grant_id)
        except (RedisError, OSError) as e:
            raise UseCountError(f"redis: {type(e).__name__}") from None


class StateFileUseCount:
    """Counts in the gateway's state folder, one locked file per grant (ids are hex)."""

    where = "state"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    async def take(self, grant: Grant) -> int | None:
        assert grant.max_uses is not None
        return await asyncio.to_thread(self._take, grant.id, grant.max_uses)

    async def used(self, grant_ids: Iterable[str]) -> dict[str, int]:
        return await asyncio.to_thread(lambda: {i: self._read(i) for i in grant_ids})

    async def forget(self, grant_id: str) -> None:
        try:
            await asyncio.to_thread(os.unlink, self._path(grant_id))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise UseCountError(f"{self.folder}: {e.strerror}") from None

    def _path(self, grant_id: str) -> Path:
        if not grant_id.isalnum():
            raise UseCountError(f"{grant_id!r} is no grant id")
        return self.folder / grant_id

    def _take(self, grant_id: str, max_uses: int) -> int | None:
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self._path(grant_id), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise UseCountError(f"{self.folder}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # every worker of this gateway takes it in turn
            n = _parse(os.pread(fd, 32, 0))
            if n >= max_uses:
                return None
            data = str(n + 1).encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            os.fsync(fd)  # a restart does not give a use back
            return n + 1
        except OSError as e:
            raise UseCountError(f"{self.folder}: {e.strerror}") from None
        finally:
            os.close(fd)  # and with it the lock

    def _read(self, grant_id: str) -> int:
        try:
            return _parse(self._path(grant_id).read_bytes())
        except FileNotFoundError:
            return 0
        except OSError as e:
            raise UseCountError(f"{self.folder}: {e.strerror}") from None


def _parse(data: bytes) -> int:
    """A count file's content; a file that is not a count counts as used up (fail closed)."""
    text = data.decode("ascii", "replace").strip()
    if not text:
        return 0
    return int(text) if text.isdigit() else 2**62


class CountedUses:
    """The gateway's GrantUses (sandgate.policy.model.grants): takes uses from a UseCount,
    remembers the grants it saw used up, and records each exhaustion once."""

    def __init__(self, count: UseCount, emit: Emit, record: Record) -> None:
        self.count = count
        self.emit = emit
        self.record = record
        self._spent: set[str] = set()

    def spent(self, grant_id: str) -> bool:
        return grant_id in self._spent

    async def take(self, grant: Grant) -> bool:
        if grant.max_uses is None:
            return True
        try:
            n = await self.count.take(grant)
        except UseCountError as e:
            log.warning("grant.uses_unreachable", id=grant.id, error=str(e))
            return False
        if n is None:
            self._spent.add(grant.id)
            return False
        if n >= grant.max_uses:
            # This request took the last use: only one taker ever sees n == max_uses.
            self._spent.add(grant.id)
            await self.emit(self.record(grant, n))
            log.info("grant.exhausted", id=grant.id, uses=n)
        return True

    async def used(self, grants: Iterable[Grant]) -> dict[str, int] | None:
        """The uses of the counted grants among `grants`; None when the count is out of reach."""
        try:
            return await self.count.used(g.id for g in grants if g.max_uses is not None)
        except UseCountError as e:
            log.warning("grant.uses_unreachable", error=str(e))
            return None

    async def forget(self, grant: Grant) -> None:
        """Drop a counted grant's count (revoked, expired): best effort."""
        if grant.max_uses is None:
            return
        try:
            await self.count.forget(grant.id)
        except UseCountError as e:
            log.warning("grant.uses_not_forgotten", id=grant.id, error=str(e))
