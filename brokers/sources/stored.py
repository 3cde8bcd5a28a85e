"""`stored:NAME`: a credential value set at run time (`sandgate credentials set`), kept in memory.

The store (a local sealed file, or redis for a fleet) is asked once per value; later requests
are served from memory with no I/O. `invalidate()` (called on a change event, a changed file,
or a reconnect) drops every cached value so the next use reads the current one. A store that
cannot be read while a value is cached keeps serving the cached value; one that is not cached
is unavailable (the request is denied).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sandgate.brokers.errors import SecretUnavailable
from sandgate.brokers.secret import Secret
from sandgate.policy.model.secret_refs import SecretRef

__all__ = ["StoredSource", "StoredValues"]

RETRY_SECONDS = 5.0


class StoredValues(Protocol):
    """What the source reads from: a `CredentialStore`'s `get`."""

    async def get(self, tenant: str, name: str) -> Secret | None: ...


@dataclass(frozen=True, slots=True)
class _Cached:
    secret: Secret | None  # None: known to be unset (a denial, cached so a guest cannot hammer the store)
    fetched: float


class StoredSource:
    """Resolves `stored:TENANT/NAME` (qualified at compile time) through a store, cached in memory.

    `ttl` bounds how long a cached value is trusted without a change event (a safety net for
    a missed event); on expiry the value is read again, and kept if the store cannot be read.
    """

    __slots__ = ("_cache", "_clock", "_generation", "_locks", "_store", "on_change", "ttl")

    def __init__(
        self, store: StoredValues, *, ttl: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self.ttl = ttl
        self._clock = clock
        self._cache: dict[tuple[str, str], _Cached] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._generation = 0
        # Told after each invalidation (the broker then resolves its tenants' secrets again).
        self.on_change: Callable[[], None] | None = None

    def invalidate(self) -> None:
        """Forget every cached value; the next use of each reads the store."""
        self._generation += 1
        self._cache.clear()
        if self.on_change is not None:
            self.on_change()

    def _fresh(self, key: tuple[str, str]) -> _Cached | None:
        cached = self._cache.get(key)
        if cached is not None and self._clock() - cached.fetched < self.ttl:
            return cached
        return None

    async def get(self, ref: SecretRef) -> Secret:
        tenant, slash, name = ref.value.partition("/")
        if not slash or not tenant or not name:
            raise SecretUnavailable("a stored: reference was not qualified with its tenant")
        key = (tenant, name)
        cached = self._fresh(key)
        if cached is None:
            lock = self._locks.setdefault(key, asyncio.Lock())
            async with lock:  # concurrent first uses share one read
                cached = self._fresh(key) or await self._fetch(key)
        if cached.secret is None:
            raise SecretUnavailable(
                f"stored credential {name} of tenant {tenant} is not set"
                f" (`sandgate credentials set --tenant {tenant} {name}` sets it)"
            )
        return cached.secret

    async def _fetch(self, key: tuple[str, str]) -> _Cached:
        generation = self._generation
        stale = self._cache.get(key)
        try:
            secret = await self._store.get(*key)
        except Exception as e:
            # Only a value no change has superseded is kept (a removal must not come back).
            if stale is not None and generation == self._generation:
                # Keep the last good value while the store is unreachable; try again in a few seconds.
                kept = _Cached(stale.secret, self._clock() - self.ttl + min(self.ttl, RETRY_SECONDS))
                self._cache[key] = kept
                return kept
            raise SecretUnavailable(f"stored credential {key[1]} of tenant {key[0]}: {e}") from None
        cached = _Cached(secret, self._clock())
        if generation == self._generation:  # a change arrived meanwhile: do not cache what we read before it
            self._cache[key] = cached
        return cached
