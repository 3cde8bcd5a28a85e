"""Tests for sandgate.policy.resolver: a real DNS server on loopback, the cache, static maps."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
from support.dnsserver import Answers, ScriptedDNSServer

from sandgate.policy.errors import ResolveError
from sandgate.policy.resolver import (
    CachingResolver,
    ChainResolver,
    NameserverResolver,
    Resolution,
    StaticResolver,
)

RECORDS: dict[str, Answers] = {
    "a.test": ["192.0.2.1"],
    "two.test": ["192.0.2.1", "192.0.2.2"],
    "dual.test": ["192.0.2.1", "2001:db8::1"],
    "v6.test": ["2001:db8::2"],
    "rebind.test": [["93.184.216.34"], ["127.0.0.1"], ["169.254.169.254"]],
}


def _serve(ttl: int) -> Iterator[ScriptedDNSServer]:
    with ScriptedDNSServer(records=RECORDS, ttl=ttl) as server:
        yield server


def _fresh(server: ScriptedDNSServer) -> ScriptedDNSServer:
    """The module's server with its script restored and its query log empty."""
    server.remove("late.test")
    for name, answers in RECORDS.items():
        server.set_records(name, answers)
    server.reset()
    return server


@pytest.fixture(scope="module")
def _dns0() -> Iterator[ScriptedDNSServer]:
    yield from _serve(ttl=0)


@pytest.fixture(scope="module")
def _dns60() -> Iterator[ScriptedDNSServer]:
    yield from _serve(ttl=60)


@pytest.fixture
def dns(_dns0: ScriptedDNSServer) -> ScriptedDNSServer:
    """A DNS server on loopback whose answers have TTL 0."""
    return _fresh(_dns0)


@pytest.fixture
def dns60(_dns60: ScriptedDNSServer) -> ScriptedDNSServer:
    """A DNS server on loopback whose answers have TTL 60."""
    return _fresh(_dns60)


def nameserver(server: ScriptedDNSServer, *, ipv6: bool = False) -> NameserverResolver:
    return NameserverResolver([f"{server.host}:{server.port}"], timeout=2.0, ipv6=ipv6)


class Recording:
    """A resolver that records calls and answers from a map."""

    def __init__(self, hosts: dict[str, list[str]], ttl: float = 60.0) -> None:
        self.calls: list[str] = []
        self._static = StaticResolver(hosts, ttl=ttl)

    async def resolve(self, host: str) -> Resolution:
        self.calls.append(host)
        await asyncio.sleep(0)
        return await self._static.resolve(host)


# --- NameserverResolver ----------------------------------------------------------------------

ANSWERS = [
    ("a.test", False, ("192.0.2.1",), "one a record is one address"),
    ("two.test", False, ("192.0.2.1", "192.0.2.2"), "every a record is returned"),
    ("dual.test", True, ("192.0.2.1", "2001:db8::1"), "a records come before aaaa records"),
    ("dual.test", False, ("192.0.2.1",), "without ipv6 only a is asked"),
    ("v6.test", True, ("2001:db8::2",), "a name with only aaaa records resolves"),
    ("A.Test", False, ("192.0.2.1",), "names are case insensitive"),
]


@pytest.mark.parametrize(
    ("name", "ipv6", "addresses"),
    [c[:3] for c in ANSWERS],
    ids=[c[3] for c in ANSWERS],
)
async def test_nameserver_answers(
    dns: ScriptedDNSServer, name: str, ipv6: bool, addresses: tuple[str, ...]
) -> None:
    result = await nameserver(dns, ipv6=ipv6).resolve(name)
    assert sorted(result.addresses) == sorted(addresses)
    if ipv6 and len(addresses) > 1:
        assert ":" not in result.addresses[0] and ":" in result.addresses[-1], "a records come first"
    assert result.ttl == 0.0
    assert dns.count(name, "A") == 1
    assert dns.count(name, "AAAA") == (1 if ipv6 else 0)


async def test_the_answer_ttl_is_reported(dns60: ScriptedDNSServer) -> None:
    assert (await nameserver(dns60, ipv6=True).resolve("dual.test")).ttl == 60.0


async def test_a_name_with_only_aaaa_records_fails_without_ipv6(dns: ScriptedDNSServer) -> None:
    with pytest.raises(ResolveError, match=r"^v6\.test: no addresses$"):
        await nameserver(dns).resolve("v6.test")


async def test_nxdomain_is_a_resolve_error(dns: ScriptedDNSServer) -> None:
    with pytest.raises(ResolveError, match=r"^missing\.test: no such name$"):
        await nameserver(dns, ipv6=True).resolve("missing.test")
    assert [q.rcode for q in dns.queries] == ["NXDOMAIN", "NXDOMAIN"]


async def test_a_silent_server_is_a_timeout() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        resolver = NameserverResolver([f"127.0.0.1:{silent.getsockname()[1]}"], timeout=0.3, ipv6=False)
        with pytest.raises(ResolveError, match=r"^a\.test: timed out$"):
            await resolver.resolve("a.test")


async def test_rotating_answers_are_seen_per_query(dns: ScriptedDNSServer) -> None:
    resolver = nameserver(dns)
    seen = [(await resolver.resolve("rebind.test")).addresses for _ in range(4)]
    assert seen == [("93.184.216.34",), ("127.0.0.1",), ("169.254.169.254",), ("169.254.169.254",)]


def test_nameservers_must_share_one_port() -> None:
    with pytest.raises(ValueError, match="same port"):
        NameserverResolver(["127.0.0.1:5353", "127.0.0.2:5354"])


# --- CachingResolver over the real server ----------------------------------------------------


async def test_ttl_zero_queries_every_time(dns: ScriptedDNSServer) -> None:
    resolver = CachingResolver(nameserver(dns))
    for _ in range(3):
        assert (await resolver.resolve("a.test")).addresses == ("192.0.2.1",)
    assert dns.count("a.test", "A") == 3


async def test_ttl_sixty_queries_once(dns60: ScriptedDNSServer) -> None:
    resolver = CachingResolver(nameserver(dns60))
    results = [await resolver.resolve("a.test") for _ in range(3)]
    assert {r.addresses for r in results} == {("192.0.2.1",)}
    assert dns60.count("a.test", "A") == 1


async def test_a_cached_answer_hides_a_rebinding_until_it_expires(dns60: ScriptedDNSServer) -> None:
    resolver = CachingResolver(nameserver(dns60))
    first = await resolver.resolve("rebind.test")
    again = await resolver.resolve("rebind.test")
    assert first.addresses == again.addresses == ("93.184.216.34",)
    assert dns60.count("rebind.test", "A") == 1


async def test_rotating_answers_are_seen_through_a_ttl_zero_cache(dns: ScriptedDNSServer) -> None:
    resolver = CachingResolver(nameserver(dns))
    seen = [(await resolver.resolve("rebind.test")).addresses for _ in range(2)]
    assert seen == [("93.184.216.34",), ("127.0.0.1",)]


async def test_min_ttl_keeps_a_ttl_zero_answer(dns: ScriptedDNSServer) -> None:
    resolver = CachingResolver(nameserver(dns), min_ttl=30)
    for _ in range(3):
        await resolver.resolve("a.test")
    assert dns.count("a.test", "A") == 1


async def test_max_ttl_zero_disables_the_cache(dns60: ScriptedDNSServer) -> None:
    resolver = CachingResolver(nameserver(dns60), max_ttl=0)
    for _ in range(3):
        await resolver.resolve("a.test")
    assert dns60.count("a.test", "A") == 3


async def test_concurrent_lookups_of_one_name_are_one_query(dns60: ScriptedDNSServer) -> None:
    resolver = CachingResolver(nameserver(dns60))
    results = await asyncio.gather(*(resolver.resolve("two.test") for _ in range(20)))
    assert {frozenset(r.addresses) for r in results} == {frozenset({"192.0.2.1", "192.0.2.2"})}
    assert dns60.count("two.test", "A") == 1


async def test_concurrent_lookups_of_one_name_are_merged_even_with_ttl_zero(dns: ScriptedDNSServer) -> None:
    resolver = CachingResolver(nameserver(dns))
    results = await asyncio.gather(*(resolver.resolve("rebind.test") for _ in range(10)))
    assert {r.addresses for r in results} == {("93.184.216.34",)}
    assert dns.count("rebind.test", "A") == 1


async def test_concurrent_lookups_of_different_names_are_not_merged(dns60: ScriptedDNSServer) -> None:
    resolver = CachingResolver(nameserver(dns60))
    a, two = await asyncio.gather(resolver.resolve("a.test"), resolver.resolve("two.test"))
    assert (a.addresses, sorted(two.addresses)) == (("192.0.2.1",), ["192.0.2.1", "192.0.2.2"])
    assert (dns60.count("a.test"), dns60.count("two.test")) == (1, 1)


async def test_a_merged_failure_reaches_every_waiter_and_is_not_cached(dns60: ScriptedDNSServer) -> None:
    resolver = CachingResolver(nameserver(dns60))
    results = await asyncio.gather(*(resolver.resolve("late.test") for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, ResolveError) for r in results)
    assert dns60.count("late.test", "A") == 1
    dns60.set_records("late.test", ["192.0.2.9"])
    assert (await resolver.resolve("late.test")).addresses == ("192.0.2.9",)


# --- CachingResolver bookkeeping -------------------------------------------------------------


async def test_the_cache_is_bounded_and_forgets_the_oldest() -> None:
    inner = Recording({"a": ["192.0.2.1"], "b": ["192.0.2.2"], "c": ["192.0.2.3"]})
    resolver = CachingResolver(inner, max_entries=2)
    for name in ("a", "b", "c", "c", "b", "a"):
        await resolver.resolve(name)
    assert inner.calls == ["a", "b", "c", "a"]


class Gated:
    """A resolver whose lookups wait until the test releases them."""

    def __init__(self, addresses: tuple[str, ...] = ("192.0.2.1",), ttl: float = 60.0) -> None:
        self.calls: list[str] = []
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self._answer = Resolution(addresses, ttl)

    async def resolve(self, host: str) -> Resolution:
        self.calls.append(host)
        self.started.set()
        await self.release.wait()
        return self._answer


async def test_cancelling_one_of_two_waiters_leaves_the_other_with_a_result() -> None:
    inner = Gated()
    resolver = CachingResolver(inner)
    first = asyncio.create_task(resolver.resolve("a.test"))
    second = asyncio.create_task(resolver.resolve("a.test"))
    await inner.started.wait()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    inner.release.set()
    assert await asyncio.wait_for(second, 5) == Resolution(("192.0.2.1",), 60.0)
    assert inner.calls == ["a.test"]


async def test_cancelling_the_first_waiter_before_the_second_arrives_still_merges() -> None:
    inner = Gated()
    resolver = CachingResolver(inner)
    first = asyncio.create_task(resolver.resolve("a.test"))
    await inner.started.wait()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    second = asyncio.create_task(resolver.resolve("a.test"))
    await asyncio.sleep(0)
    inner.release.set()
    assert (await asyncio.wait_for(second, 5)).addresses == ("192.0.2.1",)
    assert inner.calls == ["a.test"]


async def test_a_waiter_that_times_out_leaves_the_lookup_to_finish_and_be_cached() -> None:
    inner = Gated()
    resolver = CachingResolver(inner)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(resolver.resolve("a.test"), 0.05)
    inner.release.set()
    assert (await asyncio.wait_for(resolver.resolve("a.test"), 5)).addresses == ("192.0.2.1",)
    for _ in range(3):
        await asyncio.sleep(0)
    assert (await resolver.resolve("a.test")).addresses == ("192.0.2.1",)
    assert inner.calls == ["a.test"]


async def test_a_failure_nobody_waits_for_is_not_cached() -> None:
    class FailOnce:
        def __init__(self) -> None:
            self.calls = 0
            self.release = asyncio.Event()

        async def resolve(self, host: str) -> Resolution:
            self.calls += 1
            if self.calls == 1:
                await self.release.wait()
                raise ResolveError(f"{host}: timed out")
            return Resolution(("192.0.2.7",), 60.0)

    inner = FailOnce()
    resolver = CachingResolver(inner)
    waiter = asyncio.create_task(resolver.resolve("a.test"))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    inner.release.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert (await resolver.resolve("a.test")).addresses == ("192.0.2.7",)
    assert inner.calls == 2


# --- StaticResolver and ChainResolver --------------------------------------------------------


async def test_a_static_map_answers_its_names() -> None:
    static = StaticResolver({"Known.Example.": ["192.0.2.1", "2001:db8::1"]}, ttl=5)
    assert static.knows("known.example")
    assert await static.resolve("known.example") == Resolution(("192.0.2.1", "2001:db8::1"), 5)


@pytest.mark.parametrize(
    "name",
    ["unknown.example", "empty.example"],
    ids=["a name the map lacks fails", "a name mapped to nothing fails"],
)
async def test_a_static_map_fails_other_names(name: str) -> None:
    static = StaticResolver({"known.example": ["192.0.2.1"], "empty.example": []})
    with pytest.raises(ResolveError, match=f"^{name} is not in the static hosts map$"):
        await static.resolve(name)


async def test_a_chain_asks_the_static_map_first() -> None:
    fallback = Recording({"known.example": ["192.0.2.99"], "other.example": ["192.0.2.7"]})
    chain = ChainResolver(StaticResolver({"known.example": ["192.0.2.1"]}), fallback)
    assert (await chain.resolve("known.example")).addresses == ("192.0.2.1",)
    assert fallback.calls == []
    assert (await chain.resolve("other.example")).addresses == ("192.0.2.7",)
    assert fallback.calls == ["other.example"]


async def test_a_chain_passes_fallback_failures_through(dns: ScriptedDNSServer) -> None:
    chain = ChainResolver(StaticResolver({"pinned.test": ["192.0.2.50"]}), nameserver(dns))
    assert (await chain.resolve("pinned.test")).addresses == ("192.0.2.50",)
    assert (await chain.resolve("a.test")).addresses == ("192.0.2.1",)
    with pytest.raises(ResolveError, match="no such name"):
        await chain.resolve("missing.test")
    assert dns.count("pinned.test") == 0
