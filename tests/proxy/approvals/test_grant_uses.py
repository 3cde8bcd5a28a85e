"""The counts of counted grants (sandgate.proxy.approvals.uses) over a real redis-server and a
real state folder: racing takers never take more than max_uses, a count survives a new
counter (a restart), the exhaustion is recorded once, and a count out of reach fails closed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from support import RedisServer

from sandgate.policy.model.grants import Grant
from sandgate.proxy.approvals.grants import GrantBook, RedisGrants, StateFileGrants, grant_record
from sandgate.proxy.approvals.uses import CountedUses, RedisUseCount, StateFileUseCount
from sandgate.proxy.config import RedisConfig
from sandgate.proxy.redis.client import connect

GID = "0123456789abcdef0001"


def grant(max_uses: int | None = 3, expires: float | None = None, gid: str = GID) -> Grant:
    return Grant(
        id=gid,
        tenant="t1",
        sandbox="sb1",
        host="api.test",
        port=443,
        max_uses=max_uses,
        expires=expires,
        at=1.0,
    )


class Trail:
    """The audit records emitted, in order."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    async def emit(self, record: dict[str, Any]) -> bool:
        self.records.append(record)
        return True


def counted(count: RedisUseCount | StateFileUseCount, trail: Trail) -> CountedUses:
    return CountedUses(
        count, trail.emit, lambda g, n: grant_record(g, "exhausted", where=count.where, by=None, uses=n)
    )


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    c = connect(RedisConfig(url=redis_server.url, prefix="t:"))
    yield c
    await c.aclose()


async def test_racing_takers_over_redis_take_exactly_max_uses(redis_server: RedisServer) -> None:
    clients = [connect(RedisConfig(url=redis_server.url, prefix="t:")) for _ in range(2)]
    try:
        counts = [RedisUseCount(c, "t:") for c in clients]
        g = grant(max_uses=7, expires=time.time() + 60)
        taken = await asyncio.gather(*(counts[i % 2].take(g) for i in range(50)))
        assert sorted(n for n in taken if n is not None) == [1, 2, 3, 4, 5, 6, 7]
        assert await counts[0].used([GID, "ffffffffffff"]) == {GID: 7, "ffffffffffff": 0}
        ttl = await clients[0].ttl(f"t:grants:uses:{GID}")
        assert 86_000 < ttl <= 86_460, "the count is dropped a day after the grant expires"
        await counts[1].forget(GID)
        assert await counts[0].used([GID]) == {GID: 0}
    finally:
        for c in clients:
            await c.aclose()


async def test_the_exhaustion_is_recorded_once_by_the_taker_of_the_last_use(client: aioredis.Redis) -> None:
    trail = Trail()
    workers = [counted(RedisUseCount(client, "t:"), trail) for _ in range(3)]
    g = grant(max_uses=3)
    results = await asyncio.gather(*(workers[i % 3].take(g) for i in range(12)))
    assert results.count(True) == 3
    [record] = trail.records
    assert (record["event"], record["action"], record["approval_id"], record["max_uses"], record["uses"]) == (
        "grant",
        "exhausted",
        GID,
        3,
        3,
    )
    assert record["where"] == "redis"
    assert all(w.spent(GID) for w in workers), "every taker that saw none left remembers it"


async def test_with_redis_down_a_counted_grant_takes_no_use(
    redis_server: RedisServer, client: aioredis.Redis
) -> None:
    trail = Trail()
    uses = counted(RedisUseCount(client, "t:"), trail)
    assert await uses.take(grant())
    redis_server.kill()
    assert not await uses.take(grant()), "fail closed: the count is out of reach"
    assert await uses.used([grant()]) is None
    assert await uses.take(grant(max_uses=None)), "an uncounted grant is never counted"
    assert not uses.spent(GID), "out of reach is not used up"
    assert trail.records == []


def _take_in_another_process(folder: str, max_uses: int, tries: int) -> int:
    """Take `tries` uses one after the other (racing the other processes); how many were taken."""

    async def takes() -> int:
        count = StateFileUseCount(Path(folder))
        return sum([await count.take(grant(max_uses=max_uses)) is not None for _ in range(tries)])

    return asyncio.run(takes())


async def test_racing_processes_over_the_state_folder_take_exactly_max_uses(tmp_path: Path) -> None:
    folder = tmp_path / "grant-uses"
    with ProcessPoolExecutor(max_workers=4) as pool:
        loop = asyncio.get_running_loop()
        taken = await asyncio.gather(
            *(loop.run_in_executor(pool, _take_in_another_process, str(folder), 300, 150) for _ in range(4))
        )
    assert sum(taken) == 300, taken
    # A new counter (a restarted gateway) reads the same count: nothing is given back.
    again = StateFileUseCount(folder)
    assert await again.used([GID]) == {GID: 300}
    assert await again.take(grant(max_uses=300)) is None
    assert (folder / GID).stat().st_mode & 0o777 == 0o600


async def test_a_count_file_that_is_no_count_reads_as_used_up(tmp_path: Path) -> None:
    folder = tmp_path / "grant-uses"
    folder.mkdir()
    (folder / GID).write_text("garbage")
    assert await StateFileUseCount(folder).take(grant()) is None


async def test_an_unwritable_state_folder_fails_closed(tmp_path: Path) -> None:
    blocker = tmp_path / "grant-uses"
    blocker.write_text("a file where the folder should be")
    uses = counted(StateFileUseCount(blocker), Trail())
    assert not await uses.take(grant())


async def test_the_grant_book_publishes_its_count_and_revoking_forgets_it(tmp_path: Path) -> None:
    store = StateFileGrants(tmp_path / "grants.json")
    published: list[Any] = []
    trail = Trail()
    book = GrantBook(store, published.append, trail.emit, sweep=False)
    assert published[-1].uses is book.uses, "even before the first read: counted grants never go uncounted"
    await book.add(grant(max_uses=2))
    assert published[-1].uses is book.uses and published[-1].counted
    assert await book.uses.take(grant(max_uses=2))
    assert (tmp_path / "grant-uses" / GID).read_text() == "1"
    await book.revoke(GID, by="alice")
    assert not (tmp_path / "grant-uses" / GID).exists()
    assert [r["action"] for r in trail.records] == ["made", "revoked"]
    assert trail.records[0]["max_uses"] == 2


async def test_a_redis_store_counts_in_redis(client: aioredis.Redis) -> None:
    book = GrantBook(RedisGrants(client, "t:"), lambda grants: None, Trail().emit, sweep=False)
    assert await book.uses.take(grant())
    assert await client.get(f"t:grants:uses:{GID}") == b"1"
