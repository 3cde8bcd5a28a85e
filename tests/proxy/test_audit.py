"""The audit writer: ordered, rotated, never drops a record, applies back-pressure."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from sandgate.policy.decision import Decision, Identity, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.audit import AuditLog, JsonlFileSink
from sandgate.proxy.records import DecisionContext, decision_record, new_decision_id, redact_query


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
    assert audit.overflow_denials == refused
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
