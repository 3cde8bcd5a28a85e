"""A worker's forwarding sink paces small batches, so the supervisor wakes once per interval
instead of once per writer poll; large batches, acknowledged trails and close() never wait."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from sandgate.proxy.assembly.audit import file_sink
from sandgate.proxy.audit.collector import AuditCollector
from sandgate.proxy.audit.forward import DEFAULT_INTERVAL, PACE_UNTIL, ForwardSink, forward_interval
from sandgate.proxy.audit.spool import Spool
from sandgate.proxy.audit.trail import AuditLog, JsonlFileSink
from sandgate.proxy.config import GatewayConfig


def _lines(n: int, start: int = 0) -> list[str]:
    return [json.dumps({"n": i}) + "\n" for i in range(start, start + n)]


def _numbers(path: Path) -> list[int]:
    return [json.loads(line)["n"] for line in path.read_text().splitlines()]


def test_small_batches_in_a_row_go_one_interval_apart(
    tmp_path: Path, sock: Path, collector: AuditCollector
) -> None:
    sink = ForwardSink(sock, "w1", interval=0.1)
    started = time.monotonic()
    for i in range(3):
        sink.write(_lines(2, start=2 * i))
    # The first goes at once; each later one waits out the rest of the interval.
    assert time.monotonic() - started >= 0.2
    assert _numbers(tmp_path / "audit.jsonl") == list(range(6))
    assert sink.batches == 3
    sink.close()


def test_a_batch_of_pace_until_records_goes_at_once(
    tmp_path: Path, sock: Path, collector: AuditCollector
) -> None:
    sink = ForwardSink(sock, "w1", interval=30.0)
    sink.write(_lines(1))
    started = time.monotonic()
    sink.write(_lines(PACE_UNTIL, start=1))  # the writer is behind: no waiting
    assert time.monotonic() - started < 10
    assert _numbers(tmp_path / "audit.jsonl") == list(range(PACE_UNTIL + 1))
    sink.close()


class _SlowToSet(threading.Event):
    """An Event that says when someone waits on it, and lingers after it is set."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)

    def set(self) -> None:
        super().set()
        time.sleep(0.3)


def _close_during_a_paced_write(sink: ForwardSink) -> list[OSError]:
    """close() while a second batch (record 1) waits out the interval; what that write raised.
    close() wakes the paced write, then takes its time before it shuts the socket: the woken
    write must not send in that gap (a batch written whose ack is then cut reads as failed)."""
    errors: list[OSError] = []

    def second() -> None:
        try:
            sink.write(_lines(1, start=1))
        except OSError as e:
            errors.append(e)

    sink._closing = _SlowToSet()
    thread = threading.Thread(target=second)
    thread.start()
    assert sink._closing.waiting.wait(5)
    sink.close()
    thread.join(5)
    assert not thread.is_alive()
    return errors


def test_close_wakes_a_paced_write_which_then_fails_and_keeps_its_records(
    sock: Path, collector: AuditCollector
) -> None:
    sink = ForwardSink(sock, "w1", interval=30.0)
    sink.write(_lines(1))
    errors = _close_during_a_paced_write(sink)
    # Nothing reached the collector: the AuditLog keeps the batch (as for any failed write).
    assert len(errors) == 1
    assert collector.written == 1


def test_once_the_supervisor_is_gone_a_write_close_woke_or_came_after_is_spooled(
    tmp_path: Path, sock: Path, collector: AuditCollector
) -> None:
    spool = Spool(tmp_path, pid=4242)
    sink = ForwardSink(sock, "w1", interval=30.0, spool=spool)
    sink.write(_lines(1))
    sink.orphaned()
    errors = _close_during_a_paced_write(sink)
    sink.write(_lines(1, start=2))  # after close
    # Nobody else would take them: spooled for the next supervisor, never raised and retried.
    assert errors == []
    assert collector.written == 1
    assert _numbers(spool.path) == [1, 2] and sink.spooled == 2


def test_no_interval_sends_every_batch_at_once(sock: Path, collector: AuditCollector) -> None:
    sink = ForwardSink(sock, "w1", interval=0)
    started = time.monotonic()
    for i in range(20):
        sink.write(_lines(1, start=i))
    assert time.monotonic() - started < 10
    assert collector.written == 20
    sink.close()


async def test_a_paced_audit_log_writes_every_record_once(tmp_path: Path, sock: Path) -> None:
    path = tmp_path / "audit.jsonl"
    collector = AuditCollector(sock, JsonlFileSink(path, max_bytes=10**9, backups=1))
    collector.start()
    forward = ForwardSink(sock, "w1", interval=0.02)
    audit = AuditLog([forward], log_events=False)
    audit.start()
    try:
        for n in range(300):
            assert await audit.emit({"event": "decision", "n": n})
            if n % 50 == 0:
                time.sleep(0.01)  # the writer takes what is queued: batches of several
        audit.close()
    finally:
        collector.close()
    assert _numbers(path) == list(range(300))
    assert forward.batches < 300


@pytest.mark.parametrize(
    ("fsync", "expected"),
    [("off", DEFAULT_INTERVAL), ("per_batch", 0.0)],
    ids=["records nobody waits for are paced", "records requests wait for are not"],
)
def test_a_worker_paces_by_its_trails_fsync_mode(tmp_path: Path, fsync: str, expected: float) -> None:
    config = GatewayConfig.model_validate(
        {"state_dir": str(tmp_path), "audit": {"fsync": fsync}, "worker_index": 1, "worker_count": 2}
    )
    assert forward_interval(config.audit.fsync) == expected
    forward = file_sink(config)
    assert isinstance(forward, ForwardSink) and forward.interval == expected
