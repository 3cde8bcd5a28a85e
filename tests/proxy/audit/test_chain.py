"""Tamper evidence: the real writer (AuditLog, JsonlFileSink with its chain) writes real files;
`sandgate audit verify` finds each kind of tampering with its position, and passes a clean trail."""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from sandgate.proxy.audit.chain import GENESIS, Chain, line_hash, load_or_create_key, public_key_path
from sandgate.proxy.audit.trail import AuditLog, JsonlFileSink, audit_file_sink
from sandgate.proxy.cli.main import main
from sandgate.proxy.config import GatewayConfig


def chained_sink(root: Path, *, every: int = 5, max_bytes: int = 10**9, backups: int = 5) -> JsonlFileSink:
    key = load_or_create_key(root / "ca")
    return JsonlFileSink(
        root / "audit.jsonl",
        max_bytes=max_bytes,
        backups=backups,
        chain=lambda state: Chain(key, state, every=every, seconds=3600),
    )


def write_trail(root: Path, n: int, **kw: int) -> None:
    """`n` decision records through the real AuditLog writer thread, then a clean close."""
    audit = AuditLog([chained_sink(root, **kw)], log_events=False)
    audit.start()
    for i in range(n):
        audit.emit_nowait({"event": "decision", "decision_id": f"d{i:04d}", "tenant": "t1", "n": i})
    audit.close()


def trail_files(root: Path) -> list[Path]:
    rotated = sorted(root.glob("audit.jsonl.*"), key=lambda p: -int(p.suffix[1:]))
    return [*rotated, root / "audit.jsonl"]


def verify(capsys: pytest.CaptureFixture[str], root: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    files = [str(p) for p in trail_files(root)]
    key = str(public_key_path(root / "ca"))
    code = main(["audit", "verify", "--key", key, "--format", "json", *extra, *files])
    return code, json.loads(capsys.readouterr().out)


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_a_clean_trail_verifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_trail(tmp_path, 12)
    lines = [json.loads(x) for x in lines_of(tmp_path / "audit.jsonl")]
    assert lines[0]["prev"] == GENESIS
    # A checkpoint after every 5 records and one at close: 12 records, 3 checkpoints.
    assert [x["event"] for x in lines].count("checkpoint") == 3
    assert lines[-1]["event"] == "checkpoint" and lines[-1]["count"] == 12
    code, doc = verify(capsys, tmp_path)
    assert code == 0 and doc["ok"] and doc["records"] == 12 and doc["checkpoints"] == 3
    assert doc["start"] == "genesis" and doc["unsigned_tail"] == 0
    assert doc["last_good_checkpoint"]["seq"] == 3
    # The key is private to its owner; the exported PEM is its public half.
    assert os.stat(tmp_path / "ca" / "audit-signing.key").st_mode & 0o777 == 0o600
    assert "PUBLIC KEY" in public_key_path(tmp_path / "ca").read_text()


def test_prev_is_the_hash_of_the_line_before_as_written(tmp_path: Path) -> None:
    write_trail(tmp_path, 3)
    raw = lines_of(tmp_path / "audit.jsonl")
    for before, after in itertools.pairwise(raw):
        assert json.loads(after)["prev"] == line_hash(before.rstrip(b"\n"))
    # The record itself is unchanged but for its last member.
    assert json.loads(raw[0]) == {
        "event": "decision",
        "decision_id": "d0000",
        "tenant": "t1",
        "n": 0,
        "prev": GENESIS,
    }


def test_a_deleted_record_is_reported_with_its_position(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_trail(tmp_path, 12)
    path = tmp_path / "audit.jsonl"
    lines = lines_of(path)
    del lines[7]  # a record after the first checkpoint (line 6)
    path.write_bytes(b"".join(lines))
    code, doc = verify(capsys, tmp_path)
    assert code == 1 and not doc["ok"]
    assert doc["break"] == {
        "file": str(path),
        "line": 8,
        "kind": "hash_mismatch",
        "detail": doc["break"]["detail"],
    }
    assert doc["last_good_checkpoint"]["seq"] == 1 and doc["last_good_checkpoint"]["line"] == 6


def test_one_altered_byte_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_trail(tmp_path, 12)
    path = tmp_path / "audit.jsonl"
    data = bytearray(path.read_bytes())
    third = data.index(b"d0002")
    data[third + 4] = ord("9")  # d0002 -> d0009
    path.write_bytes(bytes(data))
    code, doc = verify(capsys, tmp_path)
    assert code == 1
    assert doc["break"]["line"] == 4 and doc["break"]["kind"] == "hash_mismatch"
    assert doc["last_good_checkpoint"] is None
    key = str(public_key_path(tmp_path / "ca"))
    assert main(["audit", "verify", "--key", key, str(path)]) == 1  # the text view
    out = capsys.readouterr().out
    assert out.startswith(f"TAMPERED: {path}:4: hash_mismatch:") and "last good checkpoint: none" in out


def test_an_altered_checkpoint_fails_its_signature(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_trail(tmp_path, 12)
    path = tmp_path / "audit.jsonl"
    lines = lines_of(path)
    cp = json.loads(lines[-1])
    cp["count"] = 11
    lines[-1] = json.dumps(cp, separators=(",", ":")).encode() + b"\n"
    path.write_bytes(b"".join(lines))
    code, doc = verify(capsys, tmp_path)
    assert code == 1 and doc["break"]["kind"] == "bad_signature" and doc["break"]["line"] == len(lines)
    assert doc["last_good_checkpoint"]["seq"] == 2


def test_two_swapped_records_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_trail(tmp_path, 12)
    path = tmp_path / "audit.jsonl"
    lines = lines_of(path)
    lines[2], lines[3] = lines[3], lines[2]
    path.write_bytes(b"".join(lines))
    code, doc = verify(capsys, tmp_path)
    assert code == 1 and doc["break"]["line"] == 3 and doc["break"]["kind"] == "hash_mismatch"


def test_a_truncated_trail_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_trail(tmp_path, 12)
    path = tmp_path / "audit.jsonl"
    lines = lines_of(path)
    # Cut mid-record: the last line has no newline.
    path.write_bytes(b"".join(lines[:9]) + lines[9][:20])
    code, doc = verify(capsys, tmp_path)
    assert code == 1 and doc["break"]["kind"] == "truncated" and doc["break"]["line"] == 10
    # Cut at a line boundary, the last checkpoints with it: the checkpoint a SIEM saw is missing.
    path.write_bytes(b"".join(lines[:9]))
    code, doc = verify(capsys, tmp_path, "--expect-seq", "3")
    assert code == 1 and doc["break"]["kind"] == "truncated"
    assert doc["last_good_checkpoint"]["seq"] == 1 and doc["unsigned_tail"] == 3
    # The first lines deleted: the chain does not start where it should.
    path.write_bytes(b"".join(lines[2:]))
    code, doc = verify(capsys, tmp_path)
    assert code == 1 and doc["break"]["kind"] == "start_missing" and doc["break"]["line"] == 1


def test_rotation_and_restarts_keep_one_chain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_trail(tmp_path, 20, max_bytes=600, backups=50)
    write_trail(tmp_path, 7, max_bytes=600, backups=50)  # a second gateway run continues it
    files = trail_files(tmp_path)
    assert len(files) >= 3  # each run writes one batch, rotated after it
    code, doc = verify(capsys, tmp_path)
    assert code == 0 and doc["records"] == 27 and doc["last_good_checkpoint"]["count"] == 27
    # The first line of a rotated file links to the last line of the file before it.
    second = files[1]
    assert json.loads(lines_of(second)[0])["prev"] == line_hash(lines_of(files[0])[-1].rstrip(b"\n"))
    # Without its oldest file the trail is partial: refused unless --partial says so.
    files[0].unlink()
    assert verify(capsys, tmp_path)[1]["break"]["kind"] == "start_missing"
    code, doc = verify(capsys, tmp_path, "--partial")
    assert code == 0 and doc["start"] == "mid-chain"


def test_an_unreadable_end_starts_a_new_chain_that_verify_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_trail(tmp_path, 3)
    path = tmp_path / "audit.jsonl"
    with open(path, "ab") as f:
        f.write(b"garbage\n")
    write_trail(tmp_path, 2)  # never refuses to write: a new chain, saying why
    lines = [json.loads(x) for x in lines_of(path)[5:]]
    assert lines[0]["event"] == "chain_restart" and lines[0]["prev"] == GENESIS
    code, doc = verify(capsys, tmp_path)
    assert code == 1 and doc["break"]["kind"] == "unreadable" and doc["break"]["line"] == 5


def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_trail(tmp_path, 2)
    code = main(["audit", "verify", "--key", str(tmp_path / "nope.pem"), str(tmp_path / "audit.jsonl")])
    assert code == 2
    key = str(public_key_path(tmp_path / "ca"))
    assert main(["audit", "verify", "--key", key, str(tmp_path / "missing.jsonl")]) == 2
    capsys.readouterr()


def test_a_checkpoint_follows_records_after_t_seconds_without_more(tmp_path: Path) -> None:
    key = load_or_create_key(tmp_path / "ca")
    sink = JsonlFileSink(
        tmp_path / "audit.jsonl",
        max_bytes=10**9,
        backups=1,
        chain=lambda state: Chain(key, state, every=1000, seconds=0.2),
    )
    try:
        sink.write(['{"event":"decision","n":1}\n'])
        deadline = time.monotonic() + 5
        while b'"checkpoint"' not in (tmp_path / "audit.jsonl").read_bytes():
            assert time.monotonic() < deadline, "no checkpoint written by the timer"
            time.sleep(0.05)
    finally:
        sink.close()
    events = [json.loads(x)["event"] for x in lines_of(tmp_path / "audit.jsonl")]
    assert events == ["decision", "checkpoint"]  # nothing to sign at close: no second checkpoint


def test_the_config_sets_how_often_a_checkpoint_is_written(tmp_path: Path) -> None:
    config = GatewayConfig.model_validate(
        {"state_dir": str(tmp_path), "audit": {"checkpoint_records": 3, "checkpoint_seconds": 3600}}
    )
    sink = audit_file_sink(config)
    sink.write([json.dumps({"event": "decision", "decision_id": f"d{i}"}) + "\n" for i in range(7)])
    sink.close()
    events = [json.loads(x)["event"] for x in config.audit_path.read_text().splitlines()]
    # After records 3 and 6, and the one written at close for the seventh.
    assert events.count("checkpoint") == 3
    assert events.index("checkpoint") == 3


def test_a_file_removed_from_the_middle_of_a_rotation_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_trail(tmp_path, 20, max_bytes=600, backups=50)
    write_trail(tmp_path, 7, max_bytes=600, backups=50)
    files = trail_files(tmp_path)
    assert len(files) >= 3
    files[1].unlink()
    code, doc = verify(capsys, tmp_path)
    assert code == 1
    assert doc["break"]["kind"] == "hash_mismatch"
    assert doc["break"]["file"] == str(files[2]) and doc["break"]["line"] == 1
    assert doc["last_good_checkpoint"] is not None
