"""The decision cache: Rego verdicts keyed on the input fields the policy can read.

The key is (program digest, the projected input): the digest changes whenever the tenant's
modules, the operator's modules or the tenant's data change, so a reload invalidates exactly
the tenants it changed, and a policy that reads only `dest.host` and `request.method` gets
one entry per host and method, whatever the headers. Never cached: faults, and programs
that read the clock or other changing builtins. Bounded (least recently used goes first);
an optional time to live bounds staleness when the policy lives elsewhere (an OPA server).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from sandgate.policy.rego.input_document import cache_key
from sandgate.policy.rego.protocol import PolicyEngine, RegoQuery, RegoVerdict

__all__ = ["CacheStats", "CachingEngine", "DecisionCache"]


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters since the cache was made."""

    hits: int
    misses: int
    size: int


class DecisionCache:
    """A bounded LRU of verdicts, with an optional time to live."""

    def __init__(
        self,
        max_entries: int = 10_000,
        *,
        ttl: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1:
            raise ValueError("a decision cache holds at least one entry")
        self.max_entries = max_entries
        self.ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], tuple[RegoVerdict, float]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, str]) -> RegoVerdict | None:
        """The cached verdict, or None (counted as a miss)."""
        entry = self._entries.get(key)
        if entry is not None and (self.ttl is None or entry[1] > self._clock()):
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]
        if entry is not None:
            del self._entries[key]
        self.misses += 1
        return None

    def put(self, key: tuple[str, str], verdict: RegoVerdict) -> None:
        """Remember a verdict (faults are never remembered)."""
        if verdict.fault:
            return
        expires = self._clock() + self.ttl if self.ttl is not None else 0.0
        self._entries[key] = (replace(verdict, cached=True), expires)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def stats(self) -> CacheStats:
        return CacheStats(self.hits, self.misses, len(self._entries))


class CachingEngine:
    """An engine with the decision cache in front of it."""

    def __init__(self, engine: PolicyEngine, cache: DecisionCache) -> None:
        self.engine = engine
        self.cache = cache
        self.name = engine.name

    async def evaluate(self, query: RegoQuery) -> RegoVerdict:
        if not query.program.deterministic:
            return await self.engine.evaluate(query)
        key = (query.program.digest, cache_key(query.projected))
        found = self.cache.get(key)
        if found is not None:
            return found
        verdict = await self.engine.evaluate(query)
        self.cache.put(key, verdict)
        return verdict

    async def health(self) -> bool:
        return await self.engine.health()

    async def close(self) -> None:
        await self.engine.close()
