"""The fleet audit stream sink against a real redis-server: once per id, spooled while redis is away."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from support import RedisServer

from sandgate.proxy.audit.records import new_decision_id
from sandgate.proxy.audit.redis_stream import RedisStreamSink, record_id
from sandgate.proxy.audit.trail import AuditLog, JsonlFileSink
from sandgate.proxy.config import RedisConfig
from sandgate.proxy.redis.client import Keys, connect_sync

PREFIX = "t:"


def make_sink(server: RedisServer, spool: Path, *, batch: int = 64) -> RedisStreamSink:
    client = connect_sync(RedisConfig(url=server.url, timeout_seconds=0.3))
    return RedisStreamSink(
        client, Keys(PREFIX), spool, maxlen=100_000, dedupe_ttl=3600, gateway="gw-a", batch=batch
    )


def lines(n: int, start: int = 0) -> list[str]:
    return [
        json.dumps({"event": "decision", "decision_id": new_decision_id(), "n": i}, separators=(",", ":"))
        + "\n"
        for i in range(start, start + n)
    ]


def stream(server: RedisServer) -> list[dict[bytes, bytes]]:
    return server.stream(PREFIX + "audit")


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture
def sinks() -> Iterator[list[RedisStreamSink]]:
    made: list[RedisStreamSink] = []
    yield made
    for sink in made:
        sink.close()


def test_records_are_added_once_with_their_id_gateway_and_line(
    redis_server: RedisServer, tmp_path: Path, sinks: list[RedisStreamSink]
) -> None:
    sink = make_sink(redis_server, tmp_path / "spool")
    sinks.append(sink)
    batch = lines(150)
    sink.write(batch)
    sink.write(batch)  # a retried batch (a timeout after redis applied it) adds nothing
    entries = stream(redis_server)
    assert [e[b"r"].decode() + "\n" for e in entries] == batch
    assert [e[b"id"].decode() for e in entries] == [json.loads(line)["decision_id"] for line in batch]
    assert {e[b"gw"] for e in entries} == {b"gw-a"}
    assert (sink.written, sink.duplicates, sink.spooled) == (150, 150, 0)


def test_a_line_without_an_id_is_named_by_its_content() -> None:
    assert record_id('{"decision_id":"abc123","x":1}') == "abc123"
    assert record_id('{"x":1,"decision_id":"a b"}') == "a b"
    assert record_id("not json") == record_id("not json")
    assert record_id("not json").startswith("sha256-")


def test_losing_redis_spools_in_order_and_the_replay_adds_each_record_once(
    redis_server: RedisServer, tmp_path: Path, sinks: list[RedisStreamSink]
) -> None:
    sink = make_sink(redis_server, tmp_path / "spool")
    sinks.append(sink)
    sink.start()
    first, during, after = lines(100), lines(300, 100), lines(50, 400)
    sink.write(first)
    redis_server.kill()
    started = time.monotonic()
    for i in range(0, len(during), 30):
        sink.write(during[i : i + 30])
    # One timeout at most, then only spool appends: the writer is not held up by the outage.
    assert time.monotonic() - started < 3.0
    assert sink.spooling and sink.spool_depth == 300 and sink.spooled == 300
    redis_server.start()  # a fresh, empty redis on the same port
    sink.write(after)  # while the spool is not empty, new records queue behind it
    wait_for(lambda: not sink.spooling)
    entries = stream(redis_server)
    ns = [json.loads(e[b"r"])["n"] for e in entries]
    assert ns == list(range(100, 450))  # the first 100 went with the old redis
    assert sink.spool_depth == 0 and sink.replayed == 350
    assert (tmp_path / "spool").stat().st_size == 0


def test_replaying_the_same_spool_twice_adds_nothing(
    redis_server: RedisServer, tmp_path: Path, sinks: list[RedisStreamSink]
) -> None:
    spool = tmp_path / "spool"
    spool.write_text("".join(lines(500)))
    shutil.copy(spool, tmp_path / "copy")
    sink = make_sink(redis_server, spool)
    sinks.append(sink)
    assert sink.spooling and sink.spool_depth == 500
    sink.start()
    wait_for(lambda: not sink.spooling)
    assert sink.written == 500
    shutil.copy(tmp_path / "copy", tmp_path / "again")
    again = make_sink(redis_server, tmp_path / "again")
    sinks.append(again)
    again.start()
    wait_for(lambda: not again.spooling)
    assert (again.written, again.duplicates, again.replayed) == (0, 500, 500)
    assert len(stream(redis_server)) == 500


def test_a_replay_cut_off_midway_resumes_without_duplicates(
    redis_server: RedisServer, tmp_path: Path, sinks: list[RedisStreamSink]
) -> None:
    spool = tmp_path / "spool"
    written = lines(2000)
    spool.write_text("".join(written))
    shutil.copy(spool, tmp_path / "copy")
    sink = make_sink(redis_server, spool, batch=16)
    sink.start()
    wait_for(lambda: sink.replayed >= 200)
    sink.close()  # as if the process died mid-replay: the spool is still whole on disk
    assert 0 < sink.replayed < 2000 and spool.stat().st_size > 0
    resumed = make_sink(redis_server, tmp_path / "copy")
    sinks.append(resumed)
    resumed.start()
    wait_for(lambda: not resumed.spooling)
    assert [e[b"r"].decode() + "\n" for e in stream(redis_server)] == written
    assert resumed.duplicates == sink.written


def test_a_torn_last_line_from_a_crash_is_cut_off(
    redis_server: RedisServer, tmp_path: Path, sinks: list[RedisStreamSink]
) -> None:
    spool = tmp_path / "spool"
    spool.write_text("".join(lines(3)) + '{"event":"deci')
    sink = make_sink(redis_server, spool)
    sinks.append(sink)
    assert sink.spool_depth == 3
    sink.start()
    wait_for(lambda: not sink.spooling)
    assert len(stream(redis_server)) == 3


async def test_the_audit_log_writes_file_and_stream_and_exposes_the_counters(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    sink = make_sink(redis_server, tmp_path / "spool")
    audit = AuditLog(
        [JsonlFileSink(tmp_path / "a.jsonl", max_bytes=10**8, backups=1), sink], log_events=False
    )
    audit.start()
    for i in range(300):
        assert await audit.emit({"event": "decision", "n": i, "time": time.time()})
    audit.close()
    assert audit.stream is sink
    in_file = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    in_stream = [json.loads(e[b"r"]) for e in stream(redis_server)]
    assert in_file == in_stream
    # A record that came without an id got one, the same in the file and the stream.
    assert len({r["decision_id"] for r in in_file}) == 300
    assert sink.written == 300


def test_a_failed_add_leaves_the_record_to_be_sent_again(
    redis_server: RedisServer, tmp_path: Path, sinks: list[RedisStreamSink]
) -> None:
    """The stream key holding a string makes XADD fail inside the script (WRONGTYPE): the
    records spool, and none of them may be remembered as sent."""
    client = redis.Redis.from_url(redis_server.url)
    client.set(PREFIX + "audit", "not a stream")
    sink = make_sink(redis_server, tmp_path / "spool")
    sinks.append(sink)
    batch = lines(5)
    sink.write(batch)
    assert sink.spooling and sink.spool_depth == 5
    client.delete(PREFIX + "audit")
    client.close()
    sink.start()
    wait_for(lambda: not sink.spooling)
    assert [e[b"r"].decode() + "\n" for e in stream(redis_server)] == batch


def test_a_record_longer_than_the_read_window_is_replayed(
    redis_server: RedisServer, tmp_path: Path, sinks: list[RedisStreamSink]
) -> None:
    big = (
        json.dumps({"event": "decision", "decision_id": new_decision_id(), "detail": "x" * (2 << 20)}) + "\n"
    )
    spool = tmp_path / "spool"
    spool.write_text("".join([*lines(1), big, *lines(2, 1)]))
    sink = make_sink(redis_server, spool)
    sinks.append(sink)
    sink.start()
    wait_for(lambda: not sink.spooling)
    entries = stream(redis_server)
    assert len(entries) == 4 and len(entries[1][b"r"]) == len(big) - 1
