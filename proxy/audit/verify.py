"""Check an audit trail's hash chain and signed checkpoints (`sandgate audit verify`).

The files are read oldest first, line by line. The first fault ends the walk and is reported
with its file, line number (1-based) and kind; so is the last checkpoint before it whose
signature held (everything up to it is as the gateway wrote it). Kinds:

- `truncated`: a last line without its newline (cut mid-record), or `expect_seq` names a
  checkpoint the trail no longer reaches (records cut from its end).
- `unreadable`: a line that is no JSON object; `unchained`: a line without `prev` after the
  chain began.
- `hash_mismatch`: `prev` is not the hash of the line before: that line was altered, or lines
  were deleted, inserted or reordered here.
- `start_missing`: the first line does not start a chain (its first lines were deleted, or
  rotation removed the oldest file: `partial` accepts that).
- `chain_restart`: a new chain began mid-trail (the gateway could not read the trail's end).
- `bad_signature`, `unknown_key`, `count_mismatch` (a checkpoint counts other records than
  the trail holds before it), `bad_checkpoint` (its hash is not its predecessor's).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from sandgate.proxy.audit.chain import GENESIS, checkpoint_message, key_id, line_hash

__all__ = ["Break", "Position", "Verdict", "render_verdict", "verify_trail"]

MAX_LINE = 1 << 24


@dataclass(frozen=True, slots=True)
class Position:
    file: str
    line: int


@dataclass(frozen=True, slots=True)
class Break:
    file: str
    line: int
    kind: str
    detail: str


@dataclass(slots=True)
class Verdict:
    ok: bool = True
    lines: int = 0
    records: int = 0
    checkpoints: int = 0
    start: str = "empty"  # genesis | mid-chain | after-unchained | empty
    unsigned_tail: int = 0  # records after the last checkpoint (not signed yet)
    last_good_checkpoint: dict[str, Any] | None = None
    broken: Break | None = None
    unchained_before: int = 0  # lines written before the chain existed

    def document(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["break"] = doc.pop("broken")
        return doc


@dataclass(slots=True)
class _Walk:
    key: Ed25519PublicKey
    kid: str
    partial: bool
    verdict: Verdict = field(default_factory=Verdict)
    head: str | None = None  # hash of the previous chained line
    last_unchained: str | None = None
    base: int | None = 0  # records before the first line seen (None: unknown until a checkpoint)
    seen: int = 0  # records seen since the chain's first line
    at: Position = Position("", 0)  # the line being checked


def verify_trail(
    files: list[Path], key: Ed25519PublicKey, *, partial: bool = False, expect_seq: int | None = None
) -> Verdict:
    """Walk `files` (oldest first); OSError when one cannot be read."""
    walk = _Walk(key, key_id(key), partial)
    v = walk.verdict
    for path in files:
        for number, raw in _lines(path):
            v.lines += 1
            walk.at = Position(str(path), number)
            fault = _step(walk, raw)
            if fault is not None:
                v.ok, v.broken = False, Break(str(path), number, *fault)
                return v
    last_seq = v.last_good_checkpoint["seq"] if v.last_good_checkpoint else 0
    if expect_seq is not None and last_seq < expect_seq and files:
        end = files[-1]
        v.ok = False
        v.broken = Break(
            str(end),
            _count_lines(end),
            "truncated",
            f"checkpoint {expect_seq} expected, the trail ends at {last_seq}",
        )
    return v


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:
        yield from enumerate(iter(lambda: f.readline(MAX_LINE), b""), start=1)


def _count_lines(path: Path) -> int:
    return sum(1 for _ in _lines(path))


def _step(walk: _Walk, raw: bytes) -> tuple[str, str] | None:
    """Check one line; the fault (kind, detail) or None."""
    v = walk.verdict
    if not raw.endswith(b"\n"):
        return "truncated", "the line ends without a newline (cut mid-record)"
    body = raw[:-1]
    value = _decode(body)
    if value is None:
        return "unreadable", "not a JSON object"
    prev = value.get("prev")
    if not isinstance(prev, str):
        if walk.head is None:  # before the chain began (written by an older gateway)
            v.unchained_before += 1
            walk.last_unchained = line_hash(body)
            return None
        return "unchained", "the line has no prev"
    fault = _link(walk, prev, value)
    if fault is not None:
        return fault
    walk.head = line_hash(body)
    if value.get("event") == "checkpoint":
        return _checkpoint(walk, value)
    walk.seen += 1
    v.records += 1
    v.unsigned_tail += 1
    return None


def _link(walk: _Walk, prev: str, value: dict[str, Any]) -> tuple[str, str] | None:
    v = walk.verdict
    if walk.head is None:
        if prev == GENESIS:
            v.start = "genesis"
        elif walk.last_unchained is not None and prev == walk.last_unchained:
            v.start = "after-unchained"
        elif walk.partial:
            v.start, walk.base = "mid-chain", None
        else:
            return "start_missing", "the first line does not start the chain (lines before it are missing)"
        return None
    if prev == GENESIS:
        return "chain_restart", f"a new chain starts here: {value.get('reason') or 'no reason given'}"
    if prev != walk.head:
        return "hash_mismatch", (
            "prev is not the hash of the line before: that line was altered, or lines were deleted, "
            "inserted or reordered here"
        )
    return None


def _checkpoint(walk: _Walk, cp: dict[str, Any]) -> tuple[str, str] | None:
    v = walk.verdict
    seq, count, digest, at, kid = (cp.get(k) for k in ("seq", "count", "hash", "time", "key_id"))
    if not (
        isinstance(seq, int) and isinstance(count, int) and isinstance(digest, str) and isinstance(at, str)
    ):
        return "bad_checkpoint", "a checkpoint without seq, count, hash or time"
    if kid != walk.kid:
        return "unknown_key", f"signed by key {kid!r}, not by {walk.kid}"
    if digest != cp.get("prev"):
        return "bad_checkpoint", "its hash is not the line before it"
    try:
        walk.key.verify(
            base64.b64decode(str(cp.get("sig")), validate=True),
            checkpoint_message(seq, count, digest, at, kid),
        )
    except (InvalidSignature, binascii.Error, ValueError):
        return "bad_signature", f"checkpoint {seq}: the signature does not hold"
    if walk.base is None:
        walk.base = count - walk.seen
    if walk.base + walk.seen != count:
        return (
            "count_mismatch",
            f"checkpoint {seq} counts {count} records, the trail holds {walk.base + walk.seen}",
        )
    v.checkpoints += 1
    v.unsigned_tail = 0
    v.last_good_checkpoint = {"seq": seq, "count": count, "hash": digest, "time": at, **asdict(walk.at)}
    return None


def _decode(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def render_verdict(v: Verdict, fmt: str) -> str:
    """The verdict as text (one line, two when broken) or one JSON document."""
    if fmt == "json":
        return json.dumps(v.document()) + "\n"
    cp = v.last_good_checkpoint
    last = f"checkpoint {cp['seq']} ({cp['count']} records) at {cp['file']}:{cp['line']}" if cp else "none"
    if v.broken is not None:
        b = v.broken
        return f"TAMPERED: {b.file}:{b.line}: {b.kind}: {b.detail}\nlast good checkpoint: {last}\n"
    tail = f"; {v.unsigned_tail} records after it, not signed yet" if v.unsigned_tail else ""
    counts = f"{v.records} records, {v.checkpoints} checkpoints"
    return f"intact: {counts}, chain start {v.start}; last {last}{tail}\n"
