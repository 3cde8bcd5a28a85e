"""The audit writer: ordered, rotated, never drops a record, applies back-pressure."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
import redis
from support import SmallDisk, free_port

from sandgate.policy.decision import Decision, Identity, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.audit.records import DecisionContext, decision_record, new_decision_id, redact_query
from sandgate.proxy.audit.redis_stream import RedisStreamSink
from sandgate.proxy.audit.trail import AuditLog, JsonlFileSink
from sandgate.proxy.redis.client import Keys


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_records_are_written_in_order_as_json_lines(tmp_path: Path) -> None:
    sink = JsonlFileSink(tmp_path / "a.jsonl", max_bytes=10_000_000, backups=2)
    audit = AuditLog([sink], log_events=False)
    audit.start()
    for i in range(1000):
        assert await audit.emit({"event": "decision", "n": i})
    audit.close()
    assert [r["n"] for r in _lines(tmp_path / "a.jsonl")] == list(range(1000))
    assert (tmp_path / "a.jsonl").stat().st_mode & 0o777 == 0o600


async def test_rotation_keeps_every_record_across_files(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    audit = AuditLog([JsonlFileSink(path, max_bytes=4096, backups=100)], log_events=False)
    audit.start()
    for i in range(2000):
        await audit.emit({"event": "decision", "n": i, "pad": "x" * 40})
    audit.close()
    files = sorted(tmp_path.glob("a.jsonl.*"), key=lambda p: -int(p.suffix[1:])) + [path]
    assert len(files) >= 3
    numbers = [r["n"] for f in files for r in _lines(f)]
    assert numbers == list(range(2000))


class BlockedSink:
    """A real sink whose disk is 'full' until released: writes raise OSError, then succeed."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lines: list[str] = []
        self.failures = 0

    def write(self, lines: list[str]) -> None:
        if not self.release.is_set():
            self.failures += 1
            raise OSError(28, "No space left on device")
        self.lines += lines

    def close(self) -> None:
        pass


async def test_a_failing_sink_is_retried_and_a_full_queue_pushes_back_without_dropping() -> None:
    sink = BlockedSink()
    audit = AuditLog([sink], queue_size=5, max_wait=0.2, log_events=False)
    audit.start()
    results = [await audit.emit({"event": "decision", "n": i}) for i in range(12)]
    # The writer holds one batch while retrying; the queue holds 5 more; the rest are refused
    # (the caller then denies the connection), never silently dropped.
    refused = results.count(False)
    assert refused >= 1
    assert audit.unrecorded == refused
    assert sink.failures >= 1
    sink.release.set()
    audit.close()
    written = [json.loads(line)["n"] for line in sink.lines]
    accepted = [i for i, ok in enumerate(results) if ok]
    assert written == accepted


async def test_a_waiting_emit_succeeds_once_the_writer_catches_up() -> None:
    sink = BlockedSink()
    audit = AuditLog([sink], queue_size=1, max_wait=5.0, log_events=False)
    audit.start()
    assert await audit.emit({"n": 0})
    await asyncio.sleep(0.05)  # the writer took record 0 and is retrying it
    assert await audit.emit({"n": 1})
    waiting = asyncio.ensure_future(audit.emit({"n": 2}))
    await asyncio.sleep(0.1)
    assert not waiting.done(), "a full queue makes the decision wait"
    sink.release.set()
    assert await asyncio.wait_for(waiting, 5)
    audit.close()
    assert [json.loads(line)["n"] for line in sink.lines] == [0, 1, 2]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/a?key=sk-123&x=1", "/a?key=REDACTED&x=REDACTED"),
        ("/a", "/a"),
        ("/a?opaque", "/a?opaque=REDACTED"),
        ("/a?", "/a?REDACTED"),
    ],
    ids=[
        "every query value is redacted",
        "a path without query is kept",
        "a bare query word becomes a key",
        "an empty query stays redacted",
    ],
)
def test_redact_query(path: str, expected: str) -> None:
    assert redact_query(path) == expected


def test_decision_record_fields() -> None:
    ctx = DecisionContext(
        phase=Phase.REQUEST,
        listener="regular@127.0.0.1:8080",
        client="127.0.0.1:1",
        host="api.test",
        port=443,
        method="GET",
        path="/x?t=1",
        identity=Identity("t1", "sb1"),
    )
    rec = decision_record(
        ctx,
        Decision(allowed=True, reason=Reason.ALLOWED, rule_id="t1/allow/0", address="127.0.0.2"),
        status=200,
        bytes_up=0,
        bytes_down=10,
    )
    assert rec["decision"] == "allow"
    assert rec["dest"] == {"host": "api.test", "ip": "127.0.0.2", "port": 443, "sni": None}
    assert rec["path"] == "/x?t=REDACTED"
    assert isinstance(rec["time"], float), "rendered by the writer thread, not on the hot path"
    ids = {new_decision_id() for _ in range(1000)}
    assert len(ids) == 1000


# -- durability: a full disk, a full queue, acknowledged writes --------------------------------


def _ids(path: Path) -> list[str]:
    return [str(r["decision_id"]) for r in _lines(path)]


def _decision(n: int) -> dict[str, object]:
    return {"event": "decision", "decision_id": new_decision_id(), "n": n, "pad": "x" * 200}


@pytest.mark.root
async def test_a_full_disk_is_retried_and_each_record_written_once_after_a_partial_write(
    tmp_path: Path,
) -> None:
    with SmallDisk(tmp_path / "disk", size="1m") as disk:
        path = disk.path / "a.jsonl"
        audit = AuditLog([JsonlFileSink(path, max_bytes=10**8, backups=1)], log_events=False)
        audit.start()
        for i in range(3):
            assert await audit.emit(_decision(i))
        while audit.depth or audit.written < 3:
            await asyncio.sleep(0.01)
        disk.fill()  # the file's last page still has room: the next batch is written in part
        sent = [_decision(i) for i in range(3, 60)]
        for r in sent:
            assert await audit.emit(r)
        await asyncio.sleep(1.0)  # several failed attempts (50 ms doubling)
        assert audit.written < 60, "the disk is full: a batch is held and retried"
        disk.free()
        audit.close()
        ids = _ids(path)
    assert len(ids) == len(set(ids)) == 60
    assert [r["n"] for r in _lines_of(ids, sent)] == list(range(3, 60))


def _lines_of(ids: list[str], sent: list[dict[str, object]]) -> list[dict[str, object]]:
    order = {i: n for n, i in enumerate(ids)}
    return sorted(sent, key=lambda r: order[str(r["decision_id"])])


@pytest.mark.root
async def test_a_full_disk_under_the_stream_spool_is_retried_without_duplicates(tmp_path: Path) -> None:
    # No redis at this port: every record goes to the spool, which sits on a disk that fills.
    client = redis.Redis(host="127.0.0.1", port=free_port(), socket_timeout=0.2, socket_connect_timeout=0.2)
    with SmallDisk(tmp_path / "disk", size="1m") as disk:
        spool = disk.path / "stream.spool"
        sink = RedisStreamSink(client, Keys("t:"), spool, maxlen=1000, dedupe_ttl=3600, gateway="gw")
        audit = AuditLog([sink], log_events=False)
        audit.start()
        for i in range(3):
            assert await audit.emit(_decision(i))
        while audit.written < 3:
            await asyncio.sleep(0.01)
        disk.fill()
        for i in range(3, 60):
            assert await audit.emit(_decision(i))
        await asyncio.sleep(1.0)
        assert audit.written < 60, "the disk is full: a batch is held and retried"
        disk.free()
        audit.close()
        ids = _ids(spool)
    assert len(ids) == len(set(ids)) == 60


async def test_a_reserved_place_takes_its_record_even_when_the_queue_is_full() -> None:
    sink = BlockedSink()
    audit = AuditLog([sink], queue_size=2, max_wait=0.3, log_events=False)
    audit.start()
    assert await audit.emit({"event": "decision", "decision_id": "held"})
    await asyncio.sleep(0.05)  # the writer holds it, retrying
    assert await audit.reserve("a") and await audit.reserve("b")
    started = asyncio.get_running_loop().time()
    assert not await audit.reserve("c"), "no place: the request is denied"
    assert asyncio.get_running_loop().time() - started >= 0.25
    # Its denial record finds no place either: counted, without waiting a second time.
    started = asyncio.get_running_loop().time()
    assert not await audit.emit({"event": "decision", "decision_id": "c", "decision": "deny"})
    assert asyncio.get_running_loop().time() - started < 0.1
    assert audit.unrecorded == 1
    # The reserved records never wait, even with the queue full.
    assert await asyncio.wait_for(audit.emit({"event": "decision", "decision_id": "a"}), 0.1)
    audit.emit_nowait({"event": "decision", "decision_id": "b"})
    sink.release.set()
    audit.close()
    assert [json.loads(line)["decision_id"] for line in sink.lines] == ["held", "a", "b"]


async def test_in_acknowledge_mode_emit_returns_once_the_record_is_written() -> None:
    sink = BlockedSink()
    audit = AuditLog([sink], log_events=False, acknowledge=True)
    audit.start()
    waiting = asyncio.ensure_future(audit.emit({"event": "decision", "decision_id": "x"}))
    await asyncio.sleep(0.3)
    assert not waiting.done(), "not on disk yet: the caller (the response) waits"
    sink.release.set()
    assert await asyncio.wait_for(waiting, 5)
    assert [json.loads(line)["decision_id"] for line in sink.lines] == ["x"]
    audit.close()


def test_a_torn_last_line_is_cut_when_the_file_is_opened(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"n":1}\n{"n":2}\n{"n":3,"dec')
    sink = JsonlFileSink(path, max_bytes=10**6, backups=1)
    sink.write(['{"n":4}\n'])
    sink.close()
    assert [r["n"] for r in _lines(path)] == [1, 2, 4]


def _asleep(audit: AuditLog) -> bool:
    """Whether the writer waits to be notified (rather than polling, busy)."""
    return audit._sleeping


async def _falls_asleep(audit: AuditLog, after: float) -> bool:
    """Whether the writer is asleep `after` s from now, or soon after (a thread a loaded
    machine schedules late gets there late)."""
    await asyncio.sleep(after)
    for _ in range(500):
        if _asleep(audit):
            return True
        await asyncio.sleep(0.01)
    return False


async def test_the_writer_finds_records_while_busy_and_is_woken_after_idling() -> None:
    sink = BlockedSink()
    sink.release.set()
    audit = AuditLog([sink], log_events=False)
    audit.start()

    async def written(n: int) -> None:
        for _ in range(400):
            if len(sink.lines) >= n:
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"{len(sink.lines)} of {n} records written")

    # Idle: the writer sleeps until a record wakes it.
    assert await _falls_asleep(audit, 0.05)
    assert await audit.emit({"event": "decision", "n": 0})
    await written(1)
    # Busy: it polls, nobody notifies it, and it still writes each record promptly.
    for i in range(1, 50):
        assert await audit.emit({"event": "decision", "n": i})
        assert not _asleep(audit)
        await asyncio.sleep(0.001)
    await written(50)
    # Idle again past _BUSY (1 s): asleep, and woken by the next record.
    assert await _falls_asleep(audit, 1.5)
    assert await audit.emit({"event": "decision", "n": 50})
    await written(51)
    audit.close()
    assert [json.loads(x)["n"] for x in sink.lines] == list(range(51))
