"""A worker's forwarding sink: acked batches, retried on any failure, each written exactly once."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
from support import SmallDisk

from sandgate.proxy.audit.collector import AuditCollector
from sandgate.proxy.audit.forward import ForwardSink
from sandgate.proxy.audit.trail import AuditLog, JsonlFileSink


def _lines(n: int, start: int = 0, worker: str = "w1", pad: int = 100) -> list[str]:
    return [json.dumps({"w": worker, "n": i, "pad": "x" * pad}) + "\n" for i in range(start, start + n)]


def _numbers(path: Path) -> list[int]:
    return [json.loads(line)["n"] for line in path.read_text().splitlines()]


def _file_sink(path: Path, *, fsync: bool = False) -> JsonlFileSink:
    return JsonlFileSink(path, max_bytes=10**9, backups=1, fsync=fsync)


def _wait(condition: object, timeout: float = 5.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class GatedSink:
    """The collector's real file sink behind a gate: a write waits until the gate opens."""

    def __init__(self, inner: JsonlFileSink) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.entered = threading.Event()

    def write(self, lines: list[str]) -> None:
        self.entered.set()
        self.gate.wait(10)
        self.inner.write(lines)

    def close(self) -> None:
        self.inner.close()


def test_a_batch_is_written_before_write_returns(
    tmp_path: Path, sock: Path, collector: AuditCollector
) -> None:
    sink = ForwardSink(sock, "w1")
    sink.write(_lines(10))
    # No waiting: the collector acknowledged, so the lines are in the file already.
    assert _numbers(tmp_path / "audit.jsonl") == list(range(10))
    sink.write(_lines(5, start=10))
    assert _numbers(tmp_path / "audit.jsonl") == list(range(15))
    assert collector.written == 15
    sink.close()
    with pytest.raises(OSError, match="closed"):
        sink.write(_lines(1, start=15))


def test_no_collector_raises_and_the_retry_lands_once_when_it_starts(tmp_path: Path, sock: Path) -> None:
    sink = ForwardSink(sock, "w1", timeout=1)
    batch = _lines(20)
    with pytest.raises(FileNotFoundError):
        sink.write(batch)
    collector = AuditCollector(sock, _file_sink(tmp_path / "audit.jsonl"))
    collector.start()
    try:
        sink.write(batch)
        sink.write(_lines(3, start=20))
    finally:
        sink.close()
        collector.close()
    assert _numbers(tmp_path / "audit.jsonl") == list(range(23))
    assert sink.failures == 1


def test_a_collector_restarted_between_batches_is_reconnected_to(tmp_path: Path, sock: Path) -> None:
    first = AuditCollector(sock, _file_sink(tmp_path / "audit.jsonl"))
    first.start()
    sink = ForwardSink(sock, "w1", timeout=1)
    sink.write(_lines(5))
    first.close()
    with pytest.raises(ConnectionError):
        sink.write(_lines(5, start=5))
    second = AuditCollector(sock, _file_sink(tmp_path / "audit.jsonl"))
    second.start()
    try:
        sink.write(_lines(5, start=5))
    finally:
        sink.close()
        second.close()
    assert _numbers(tmp_path / "audit.jsonl") == list(range(10))


@pytest.mark.root
def test_a_full_disk_is_refused_with_its_errno_and_the_retry_writes_once(tmp_path: Path, sock: Path) -> None:
    with SmallDisk(tmp_path / "disk", size="1m") as disk:
        path = disk.path / "audit.jsonl"
        collector = AuditCollector(sock, _file_sink(path))
        collector.start()
        sink = ForwardSink(sock, "w1")
        try:
            sink.write(_lines(3))
            disk.fill()  # the file's last page still has room: the batch is written in part, then cut
            batch = _lines(50, start=3, pad=400)
            with pytest.raises(OSError, match="No space left on device"):
                sink.write(batch)
            assert collector.failed == 1
            assert _numbers(path) == [0, 1, 2], "nothing of the refused batch stays in the file"
            disk.free()
            sink.write(batch)
        finally:
            sink.close()
            collector.close()
        assert _numbers(path) == list(range(53))


def test_an_ack_lost_after_the_write_is_deduped_on_retry(tmp_path: Path, sock: Path) -> None:
    # The worker gives up waiting (timeout) while the collector is still writing: the batch
    # lands, its ack goes to a closed connection, and the worker sends it again.
    gated = GatedSink(_file_sink(tmp_path / "audit.jsonl"))
    collector = AuditCollector(sock, gated)
    collector.start()
    sink = ForwardSink(sock, "w1", timeout=0.3)
    try:
        batch = _lines(7)
        with pytest.raises(TimeoutError):
            sink.write(batch)
        assert gated.entered.wait(5), "the collector took the batch into its sink"
        gated.gate.set()
        _wait(lambda: collector.written == 7)
        sink.write(batch)  # the retry: acknowledged without a second write
        assert collector.duplicates == 1
        sink.write(_lines(2, start=7))
    finally:
        sink.close()
        collector.close()
    assert _numbers(tmp_path / "audit.jsonl") == list(range(9))


def test_a_retry_sent_while_the_first_attempt_is_still_being_written_is_written_once(
    tmp_path: Path, sock: Path
) -> None:
    # The first attempt holds the sink; the retry arrives on a new connection meanwhile and
    # waits for the lock, then finds its number written.
    gated = GatedSink(_file_sink(tmp_path / "audit.jsonl"))
    collector = AuditCollector(sock, gated)
    collector.start()
    sink = ForwardSink(sock, "w1", timeout=0.3)
    try:
        batch = _lines(4)
        with pytest.raises(TimeoutError):
            sink.write(batch)
        sink.timeout = 5  # the retry waits long enough for the first attempt to finish
        retry = threading.Thread(target=sink.write, args=(batch,))
        retry.start()
        time.sleep(0.2)
        gated.gate.set()
        retry.join(10)
        assert collector.written == 4 and collector.duplicates == 1
    finally:
        sink.close()
        collector.close()
    assert _numbers(tmp_path / "audit.jsonl") == list(range(4))


class FailingSink:
    """The collector's real file sink that refuses the frames whose first record is in `refuse`."""

    def __init__(self, inner: JsonlFileSink, refuse: set[int]) -> None:
        self.inner = inner
        self.refuse = refuse

    def write(self, lines: list[str]) -> None:
        first = json.loads(lines[0])["n"]
        if first in self.refuse:
            self.refuse.discard(first)
            raise OSError(5, "Input/output error")
        self.inner.write(lines)

    def close(self) -> None:
        self.inner.close()


def test_a_batch_over_the_frame_limit_goes_in_frames_and_a_retry_resends_only_the_rest(
    tmp_path: Path, sock: Path
) -> None:
    # 100 records of ~130 bytes in frames of at most 1 KiB: 7 per frame, 15 frames. The frame
    # starting at record 42 fails once: frames before it stay written, the retry sends the rest.
    collector = AuditCollector(sock, FailingSink(_file_sink(tmp_path / "audit.jsonl"), {42}))
    collector.start()
    sink = ForwardSink(sock, "w1", max_body=1024)
    try:
        batch = _lines(100)
        with pytest.raises(OSError, match="Input/output error"):
            sink.write(batch)
        assert _numbers(tmp_path / "audit.jsonl") == list(range(42))
        sink.write(batch)
    finally:
        sink.close()
        collector.close()
    assert _numbers(tmp_path / "audit.jsonl") == list(range(100))
    assert sink.batches == 15 and collector.duplicates == 0


def test_a_new_forwarder_for_the_same_worker_is_not_taken_for_repeats(tmp_path: Path, sock: Path) -> None:
    # A restarted worker numbers its batches from 1 again, under a new session.
    with_collector = AuditCollector(sock, _file_sink(tmp_path / "audit.jsonl"))
    with_collector.start()
    try:
        for start in (0, 5):
            sink = ForwardSink(sock, "w1")
            sink.write(_lines(5, start=start))
            sink.close()
    finally:
        with_collector.close()
    assert _numbers(tmp_path / "audit.jsonl") == list(range(10))


class SlowSink:
    """The collector's real file sink (fsync per batch), slowed so an early return would show."""

    def __init__(self, inner: JsonlFileSink) -> None:
        self.inner = inner

    def write(self, lines: list[str]) -> None:
        time.sleep(0.2)
        self.inner.write(lines)

    def close(self) -> None:
        self.inner.close()


async def test_an_acknowledging_audit_log_returns_from_emit_once_the_record_is_in_the_file(
    tmp_path: Path, sock: Path
) -> None:
    path = tmp_path / "audit.jsonl"
    collector = AuditCollector(sock, SlowSink(_file_sink(path, fsync=True)))
    collector.start()
    audit = AuditLog([ForwardSink(sock, "w1")], log_events=False, acknowledge=True)
    audit.start()
    try:
        for n in range(3):
            assert await audit.emit({"event": "decision", "n": n})
            assert _numbers(path) == list(range(n + 1))
    finally:
        audit.close()
        collector.close()


async def test_an_audit_log_keeps_its_records_while_the_collector_is_down(tmp_path: Path, sock: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog([ForwardSink(sock, "w1", timeout=1)], log_events=False)
    audit.start()
    for n in range(50):
        assert await audit.emit({"event": "decision", "n": n})
    await asyncio.sleep(0.3)  # a few failed attempts (50 ms doubling)
    assert audit.written == 0
    collector = AuditCollector(sock, _file_sink(path))
    collector.start()
    try:
        for n in range(50, 60):
            assert await audit.emit({"event": "decision", "n": n})
        audit.close()
    finally:
        collector.close()
    assert _numbers(path) == list(range(60))


def test_a_worker_id_must_fit_the_frame(sock: Path) -> None:
    with pytest.raises(ValueError, match="worker id"):
        ForwardSink(sock, "")
    with pytest.raises(ValueError, match="worker id"):
        ForwardSink(sock, "w" * 256)
