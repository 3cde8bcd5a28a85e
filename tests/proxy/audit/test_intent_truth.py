"""What a process's death would leave in the trail, at each moment of a record's life: the
intent journal says what happened (allowed and gone, refused, cut), never what did not. A real
journal file and trail writer; the sink holds the writer (a full disk) so that the moment
between queueing and writing can be looked at."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from sandgate.proxy.audit.intents import CUT_BY_EXIT, IntentJournal, read_leftovers
from sandgate.proxy.audit.trail import AuditLog


class HeldSink:
    """A sink whose writes fail (a full disk) until released, then succeed."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lines: list[str] = []

    def write(self, lines: list[str]) -> None:
        if not self.release.is_set():
            raise OSError(28, "No space left on device")
        self.lines += lines

    def close(self) -> None:
        pass


@pytest.fixture
def sink() -> HeldSink:
    return HeldSink()


@pytest.fixture
def journal(tmp_path: Path) -> IntentJournal:
    return IntentJournal(tmp_path / "journal", pid=4545)


def trail(sink: HeldSink, journal: IntentJournal, queue_size: int = 100) -> AuditLog:
    audit = AuditLog([sink], queue_size=queue_size, max_wait=0.1, log_events=False, journal=journal)
    audit.start()
    return audit


def left(journal: IntentJournal) -> list[tuple[Any, ...]]:
    """What a death now would write: (decision id, decision, error) of each open intent."""
    found = read_leftovers(journal.path.parent, lambda pid: False)
    return [(r["decision_id"], r["decision"], r.get("error")) for f in found for r in f.records]


def written_out(audit: AuditLog, sink: HeldSink, journal: IntentJournal) -> list[tuple[Any, ...]]:
    """The disk freed and the trail closed (everything queued written): what a death would
    still write."""
    sink.release.set()
    audit.close()
    return left(journal)


def record(decision_id: str, decision: str, **extra: Any) -> dict[str, Any]:
    return {"event": "decision", "decision_id": decision_id, "decision": decision, **extra}


async def test_an_allow_that_finds_no_place_leaves_nothing_to_write(
    sink: HeldSink, journal: IntentJournal
) -> None:
    audit = trail(sink, journal, queue_size=1)
    refused = None
    for i in range(50):  # the writer holds what it took; the queue's one place fills
        if not await audit.emit(record(f"t{i}", "allow")):
            refused = f"t{i}"
            break
    assert refused is not None, "the queue never filled"
    # The tunnel it stood for was refused: a death now must not record it as allowed, while
    # the allowed ones still waiting to be written are kept.
    assert [decision_id for decision_id, _, _ in left(journal)] == [f"t{i}" for i in range(int(refused[1:]))]
    assert written_out(audit, sink, journal) == []


async def test_a_reserved_request_refused_is_journaled_as_its_refusal(
    sink: HeldSink, journal: IntentJournal
) -> None:
    audit = trail(sink, journal)
    assert await audit.reserve("r1", record("r1", "allow"))
    assert left(journal) == [("r1", "allow", CUT_BY_EXIT)], "allowed: a death now cuts it"
    # Refused before anything went upstream (a limit, a body): queued, not yet written.
    assert await audit.emit(record("r1", "deny", reason="rate_limited"))
    assert left(journal) == [("r1", "deny", None)]
    assert written_out(audit, sink, journal) == [] and len(sink.lines) == 1


async def test_a_refusal_queued_without_waiting_replaces_the_reservation_too(
    sink: HeldSink, journal: IntentJournal
) -> None:
    audit = trail(sink, journal)
    assert await audit.reserve("r2", record("r2", "allow"))
    audit.emit_nowait(record("r2", "deny", reason="body_too_large"))
    assert left(journal) == [("r2", "deny", None)]
    assert written_out(audit, sink, journal) == []


async def test_what_report_mode_lets_through_is_journaled_before_it_goes(
    sink: HeldSink, journal: IntentJournal
) -> None:
    audit = trail(sink, journal)
    assert await audit.emit(record("w1", "would_deny"))
    assert left(journal) == [("w1", "would_deny", None)]
    assert await audit.emit(record("d2", "deny"))
    assert ("d2", "deny", None) not in left(journal), "a refusal on its own needs no intent"
    assert written_out(audit, sink, journal) == []


async def test_an_aggregate_is_journaled_before_the_requests_it_stands_for_let_go(
    sink: HeldSink, journal: IntentJournal
) -> None:
    audit = trail(sink, journal)
    for decision_id in ("s1", "s3"):
        assert await audit.reserve(decision_id, record(decision_id, "allow"))
    aggregate = record("abuse", "deny", reason="protocol_abuse", streams_cut=["s1", "s3"])
    audit.cover(aggregate, ["s1", "s3"])
    assert left(journal) == [("abuse", "deny", None)], "the cut streams stay recorded, once"
    assert await audit.emit(aggregate)
    assert written_out(audit, sink, journal) == [] and len(sink.lines) == 1


async def test_a_reservation_the_journal_refuses_keeps_the_held_requests_end(
    sink: HeldSink, journal: IntentJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    audit = trail(sink, journal)
    assert audit.intend(record("h1", "deny", reason="internal_error")) is True
    # Released by an operator, its reservation cannot be journaled (a full disk under it).
    monkeypatch.setattr(journal, "add", lambda *args, **kwargs: None)
    assert not await audit.reserve("h1", record("h1", "allow"))
    monkeypatch.undo()
    assert left(journal) == [("h1", "deny", CUT_BY_EXIT)], "the held request's end still stands"
    assert audit.depth == 0, "the place is given back"
    written_out(audit, sink, journal)


async def test_a_released_hold_never_reopens_a_reservation_whose_record_was_written(
    sink: HeldSink, journal: IntentJournal
) -> None:
    audit = trail(sink, journal)
    assert await audit.reserve("x1", record("x1", "allow"))
    assert audit.intend(record("x1", "deny", reason="internal_error")) is True  # its body held
    # Drained meanwhile: the exchange's record is queued (and then written) while held.
    audit.emit_nowait(record("x1", "deny", reason="internal_error", detail="shutting down"))
    assert left(journal) == [("x1", "deny", None)]
    assert audit.hold_ended("x1", released=True), "an approval already decided resumes"
    assert left(journal) == [("x1", "deny", None)], "the reservation is not put back"
    assert written_out(audit, sink, journal) == [], "no intent left open for good"


async def test_an_aggregate_the_journal_refuses_leaves_the_streams_until_it_is_written(
    sink: HeldSink, journal: IntentJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    audit = trail(sink, journal)
    for decision_id in ("s1", "s2"):
        assert await audit.reserve(decision_id, record(decision_id, "allow"))
    aggregate = record("abuse", "deny", reason="protocol_abuse", streams_cut=["s1", "s2"])
    with monkeypatch.context() as patched:
        patched.setattr(journal, "add", lambda *args, **kwargs: None)
        audit.cover(aggregate, ["s1", "s2"])
    assert [decision_id for decision_id, _, _ in left(journal)] == ["s1", "s2"], "still recorded"
    assert audit.depth == 0, "their places given back"
    assert await audit.emit(aggregate)
    assert written_out(audit, sink, journal) == [], "the aggregate, once written, closes the streams it names"
