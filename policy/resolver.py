"""The gateway's own resolver: static map, given nameservers, or the system's, with a TTL cache.

The gateway resolves a name once per decision, checks the addresses, and dials the one it
checked; nothing downstream resolves again, so DNS rebinding cannot switch the address.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import dns._features

# Plain DNS over UDP/TCP only: without this, dnspython's query module loads its DNS-over-HTTPS
# client stack (httpcore, httpx, trio) whenever it is installed, ~0.15 s in every process.
dns._features.force("doh", False)

import dns.asyncresolver  # noqa: E402
import dns.exception  # noqa: E402
import dns.rdatatype  # noqa: E402
import dns.resolver  # noqa: E402

from sandgate.policy.errors import ResolveError  # noqa: E402

__all__ = [
    "CachingResolver",
    "ChainResolver",
    "NameserverResolver",
    "Resolution",
    "Resolver",
    "StaticResolver",
    "SystemResolver",
]


@dataclass(frozen=True, slots=True)
class Resolution:
    """The addresses a name resolved to (canonical text) and how long they may be kept."""

    addresses: tuple[str, ...]
    ttl: float


class Resolver(Protocol):
    """Resolves a normalised host name; raises ResolveError when it cannot."""

    async def resolve(self, host: str) -> Resolution: ...


class StaticResolver:
    """A fixed hosts map, for tests and air-gapped sites. Unknown names fail."""

    def __init__(self, hosts: Mapping[str, Sequence[str]], ttl: float = 300.0) -> None:
        self._hosts = {k.lower().rstrip("."): tuple(v) for k, v in hosts.items()}
        self._ttl = ttl

    def knows(self, host: str) -> bool:
        return host in self._hosts

    async def resolve(self, host: str) -> Resolution:
        found = self._hosts.get(host)
        if not found:
            raise ResolveError(f"{host} is not in the static hosts map")
        return Resolution(found, self._ttl)


class SystemResolver:
    """The system resolver via getaddrinfo (in a thread, so the event loop never blocks)."""

    def __init__(self, ttl: float = 30.0) -> None:
        self._ttl = ttl

    async def resolve(self, host: str) -> Resolution:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError as e:
            raise ResolveError(f"{host}: {e.strerror or e}") from None
        addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses:
            raise ResolveError(f"{host}: no addresses")
        return Resolution(addresses, self._ttl)


class NameserverResolver:
    """Given nameservers (`host` or `host:port`), A then AAAA, honouring the answers' TTL."""

    def __init__(self, nameservers: Sequence[str], timeout: float = 2.0, ipv6: bool = True) -> None:
        self._resolver = dns.asyncresolver.Resolver(configure=False)
        servers, ports = [], set()
        for ns in nameservers:
            host, port = _split_ns(ns)
            servers.append(host)
            ports.add(port)
        if len(ports) > 1:
            raise ValueError("all nameservers must use the same port")
        self._resolver.nameservers = servers
        self._resolver.port = ports.pop() if ports else 53
        self._resolver.lifetime = timeout
        self._resolver.cache = None
        self._types = (dns.rdatatype.A, dns.rdatatype.AAAA) if ipv6 else (dns.rdatatype.A,)

    async def resolve(self, host: str) -> Resolution:
        results = await asyncio.gather(*(self._query(host, t) for t in self._types), return_exceptions=True)
        addresses: list[str] = []
        ttls: list[float] = []
        failures: list[str] = []
        for result in results:
            if isinstance(result, BaseException):
                failures.append(str(result))
                continue
            addrs, ttl = result
            addresses += addrs
            if addrs:
                ttls.append(ttl)
        if not addresses:
            raise ResolveError(f"{host}: {failures[0] if failures else 'no addresses'}")
        return Resolution(tuple(addresses), min(ttls))

    async def _query(self, host: str, rdtype: dns.rdatatype.RdataType) -> tuple[list[str], float]:
        try:
            answer = await self._resolver.resolve(host, rdtype, search=False)
        except dns.resolver.NXDOMAIN:
            raise ResolveError("no such name") from None
        except dns.resolver.NoAnswer:
            return [], 0.0
        except dns.exception.Timeout:
            raise ResolveError("timed out") from None
        except dns.exception.DNSException as e:
            raise ResolveError(type(e).__name__) from None
        ttl = float(answer.rrset.ttl) if answer.rrset is not None else 0.0
        return [r.to_text() for r in answer], ttl


class ChainResolver:
    """A static map first, then another resolver for everything else."""

    def __init__(self, static: StaticResolver, fallback: Resolver) -> None:
        self._static = static
        self._fallback = fallback

    async def resolve(self, host: str) -> Resolution:
        if self._static.knows(host):
            return await self._static.resolve(host)
        return await self._fallback.resolve(host)


class CachingResolver:
    """A bounded TTL cache in front of a resolver; concurrent lookups of one name are merged.

    TTLs are clamped to [min_ttl, max_ttl]; failures are not cached.
    """

    def __init__(
        self,
        inner: Resolver,
        *,
        min_ttl: float = 0.0,
        max_ttl: float = 300.0,
        max_entries: int = 100_000,
    ) -> None:
        self._inner = inner
        self._min_ttl = min_ttl
        self._max_ttl = max_ttl
        self._max_entries = max_entries
        self._cache: OrderedDict[str, tuple[float, Resolution]] = OrderedDict()
        self._pending: dict[str, asyncio.Future[Resolution]] = {}

    async def resolve(self, host: str) -> Resolution:
        hit = self._cache.get(host)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        task = self._pending.get(host)
        if task is None:
            # The lookup runs as its own task: one caller giving up cancels its wait, not the lookup.
            # It is held in `_pending` until it ends (policy/ may not import sandgate.proxy.tasks).
            task = asyncio.ensure_future(self._lookup(host))  # noqa: TID251
            self._pending[host] = task
        return await asyncio.shield(task)

    async def _lookup(self, host: str) -> Resolution:
        try:
            result = await self._inner.resolve(host)
            self._store(host, result, time.monotonic())
            return result
        finally:
            self._pending.pop(host, None)

    def _store(self, host: str, result: Resolution, now: float) -> None:
        ttl = min(max(result.ttl, self._min_ttl), self._max_ttl)
        if ttl <= 0:
            return
        self._cache[host] = (now + ttl, result)
        self._cache.move_to_end(host)
        while len(self._cache) > self._max_entries:
            self._cache.popitem(last=False)


def _split_ns(text: str) -> tuple[str, int]:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else 53
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, int(port)
    return text, 53
