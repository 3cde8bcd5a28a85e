"""The console's parts without a browser: the shared tail of a real trail file (a stream that
falls behind is dropped, the tail stops with its last stream), sessions ending at their TTL,
and the login limit's sliding minute. (In-process: they belong under tests/proxy/console/.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sandgate.brokers import Secret
from sandgate.proxy.audit.query import Query
from sandgate.proxy.console.feed import QUEUE_MAX, DecisionFeed, Subscriber
from sandgate.proxy.console.sessions import LoginLimiter, SessionBook, csrf_matches
from sandgate.proxy.console.trail import file_trail


def append(path: Path, count: int, tenant: str = "t1", start: int = 0) -> None:
    with path.open("a") as f:
        for i in range(start, start + count):
            record = {"event": "decision", "decision_id": f"d{i}", "tenant": tenant, "decision": "deny"}
            f.write(json.dumps(record) + "\n")


async def wait_for(condition: object, timeout: float = 10.0) -> None:
    assert callable(condition)
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def tail_running(feed: DecisionFeed, trail: Path) -> Subscriber:
    """The feed's tail started, once it reads the file (it starts at the end of the file, when
    its thread runs): a probe stream's own records are appended until the last one arrives,
    so none is still on its way. The probe keeps the tail running until it is unsubscribed."""
    probe = feed.subscribe(Query(tenants=frozenset({"probe"})), lambda: None)
    assert probe is not None
    for i in range(10_000, 10_100):
        append(trail, 1, tenant="probe", start=i)
        for _ in range(20):
            await asyncio.sleep(0.01)
            if any(f'"d{i}"' in event for event in probe.queue):
                return probe
    raise AssertionError("the feed never tailed the file")


async def test_a_stream_that_falls_behind_is_dropped_and_the_others_go_on(tmp_path: Path) -> None:
    trail = tmp_path / "audit.jsonl"
    trail.write_text("")
    feed = DecisionFeed(file_trail(trail), max_clients=3)
    dropped: list[str] = []
    probe = await tail_running(feed, trail)
    slow = feed.subscribe(Query(), lambda: dropped.append("slow"))
    other_tenant = feed.subscribe(Query(tenants=frozenset({"t2"})), lambda: dropped.append("t2"))
    feed.unsubscribe(probe)
    assert slow is not None and other_tenant is not None
    try:
        append(trail, QUEUE_MAX)
        await wait_for(lambda: len(slow.queue) == QUEUE_MAX)
        assert not slow.dropped and len(other_tenant.queue) == 0
        append(trail, 1, start=QUEUE_MAX)
        await wait_for(lambda: slow.dropped)
        assert dropped == ["slow"] and len(slow.queue) == 0, "dropped, its queue freed"
        append(trail, 2, tenant="t2", start=QUEUE_MAX + 1)
        await wait_for(lambda: len(other_tenant.queue) == 2)
        assert all('"tenant":"t2"' in e for e in other_tenant.queue), "filtered on the server"
    finally:
        feed.unsubscribe(slow)
        feed.unsubscribe(other_tenant)
    assert feed.dropped == 1 and feed.clients == 0
    assert feed._stop is None, "the tail stops with its last stream"


async def test_streams_beyond_the_cap_are_refused(tmp_path: Path) -> None:
    feed = DecisionFeed(file_trail(tmp_path / "absent.jsonl"), max_clients=1)
    first = feed.subscribe(Query(), lambda: None)
    assert first is not None
    assert feed.subscribe(Query(), lambda: None) is None
    feed.unsubscribe(first)
    again = feed.subscribe(Query(), lambda: None)
    assert again is not None
    feed.unsubscribe(again)
    assert await feed.backlog(Query(), 10) == [], "no trail yet: an empty start, not an error"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_ends_at_its_ttl_and_at_logout() -> None:
    clock = Clock()
    book = SessionBook(Secret("the-admin-token-0123456789"), ttl=60, clock=clock)
    assert book.token_matches("the-admin-token-0123456789")
    assert not book.token_matches("the-admin-token-012345678")
    session = book.open()
    assert book.find(session.id) == session and session.id != session.csrf
    assert csrf_matches(session, session.csrf) and not csrf_matches(session, None)
    assert not csrf_matches(session, session.id)
    clock.now += 59
    assert book.find(session.id) is not None
    clock.now += 1
    assert book.find(session.id) is None, "expired at its TTL"
    other = book.open()
    book.close(other.id)
    assert book.find(other.id) is None
    assert book.find(None) is None and book.find("") is None


@pytest.mark.parametrize(("failures", "allowed"), [(2, True), (3, False)], ids=["under", "at the limit"])
def test_the_login_limit_is_per_address_over_a_sliding_minute(failures: int, allowed: bool) -> None:
    clock = Clock()
    limiter = LoginLimiter(3, clock=clock)
    for _ in range(failures):
        limiter.failed("192.0.2.1")
    assert limiter.allowed("192.0.2.1") is allowed
    assert limiter.allowed("192.0.2.2"), "another address is not limited"
    clock.now += 60
    assert limiter.allowed("192.0.2.1"), "a minute later"
