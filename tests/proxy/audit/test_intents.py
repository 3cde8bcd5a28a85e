"""The intent journal and the spool, in process: what a dead process left lands in the trail once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sandgate.proxy.audit.intents import CUT_BY_EXIT, IntentJournal, read_leftovers
from sandgate.proxy.audit.leftovers import settle_dead_processes
from sandgate.proxy.audit.spool import Spool
from sandgate.proxy.audit.trail import JsonlFileSink


def record(i: int, decision: str = "allow") -> dict[str, Any]:
    return {"event": "decision", "decision_id": f"id{i:04d}", "decision": decision, "path": f"/r{i}"}


def line(r: dict[str, Any]) -> str:
    return json.dumps(r, separators=(",", ":")) + "\n"


def dead(_pid: int) -> bool:
    return False


def test_only_intents_without_a_record_are_left(tmp_path: Path) -> None:
    journal = IntentJournal(tmp_path, pid=111)
    for i in range(5):
        assert journal.add(f"id{i:04d}", line(record(i)), reserved=i % 2 == 0)
    journal.done(["id0000", "id0003", "not-an-intent"])
    # Killed here: the file is what it left (close() would keep it too: intents are open).
    (left,) = read_leftovers(tmp_path, dead)
    assert left.pid == 111
    by_id = {r["decision_id"]: r for r in left.records}
    assert sorted(by_id) == ["id0001", "id0002", "id0004"]
    assert by_id["id0002"]["error"] == CUT_BY_EXIT and by_id["id0002"]["status"] is None
    assert "error" not in by_id["id0001"], "an emitted record is written as it was"


def test_a_journal_stays_small_and_a_clean_close_removes_it(tmp_path: Path) -> None:
    journal = IntentJournal(tmp_path, compact_bytes=4096, pid=222)
    for i in range(2000):
        journal.add(f"id{i:04d}", line(record(i)), reserved=True)
        journal.done([f"id{i:04d}"])
    journal.add("open", line(record(9999) | {"decision_id": "open"}), reserved=True)
    assert journal.path.stat().st_size < 8192
    (left,) = read_leftovers(tmp_path, dead)
    assert [r["decision_id"] for r in left.records] == ["open"]
    journal.done(["open"])
    journal.close()
    assert not journal.path.exists()


def test_a_live_process_journal_is_not_touched(tmp_path: Path) -> None:
    IntentJournal(tmp_path, pid=333).add("x", line(record(1)), reserved=True)
    assert read_leftovers(tmp_path, lambda pid: pid == 333) == []


def test_settling_writes_each_record_once_and_skips_what_the_trail_has(tmp_path: Path) -> None:
    state = tmp_path / "state"
    worker = state / "workers" / "w1"
    trail_path = state / "audit" / "audit.jsonl"
    sink = JsonlFileSink(trail_path, max_bytes=1 << 30, backups=2)
    # Already in the trail: record 1 (its `done` line never made it), and spooled record 10.
    sink.write([line(record(1)), line(record(10))])
    journal = IntentJournal(worker, pid=444)
    for i in (1, 2, 3):
        journal.add(f"id{i:04d}", line(record(i)), reserved=True)
    # A tunnel's allow record, emitted: written as it was, and not a request the exit cut.
    journal.add("id0004", line(record(4)), reserved=False)
    spool = Spool(worker, pid=444)
    spool.write([line(record(10)), line(record(11))])
    # A line cut by the death: never a whole write, never a record.
    with journal.path.open("ab") as f:
        f.write(b'R {"decision_id":"id0099"')
    settled = settle_dead_processes(state, trail_path, sink.write, alive=dead)
    assert (settled.merged, settled.cut) == (1, 2)
    ids = [json.loads(x)["decision_id"] for x in trail_path.read_text().splitlines()]
    assert sorted(ids) == ["id0001", "id0002", "id0003", "id0004", "id0010", "id0011"]
    assert not list(worker.iterdir()), "settled files are removed"
    # Settling again (a supervisor that died mid-way runs it once more) adds nothing.
    assert settle_dead_processes(state, trail_path, sink.write, alive=dead).cut == 0
    sink.close()
