"""The intent journal: what a process let go upstream, on disk before it goes, until its record is written.

A record waits in the process's audit queue (and, with workers, on its way to the supervisor's
collector) after the request it stands for went upstream. A process killed in between took
that record with it: the upstream saw a request the trail never did. So, before anything goes
upstream, the process appends an intent to its journal (`intents-<pid>.log` in its own folder):

    R <record>      a place reserved for an allowed request's record (completed when it ends),
                    or a held request's end (refused, should the process die holding it)
    E <record>      a record emitted, the record itself: what let traffic go (an allow, a
                    would_deny), a refusal in place of its request's `R`, an aggregate
    D <id> <id> …   the records of these decision ids were written (or given back)

An id's last line is its intent: a later line replaces an earlier one.

The append is one `os.write` of a line to a local file (page cache, no fsync: it outlives the
process, not the machine; a few microseconds). The file is rewritten with only the open intents
whenever it passes `compact_bytes`, so it stays small. When the process is gone (the supervisor
sees a worker exit; a gateway of one process starts again), `settle_leftovers` writes each
intent still open as its record: an `R` one with `error: "cut by worker exit"`, an `E` one as it
was; ids already in the trail (the process died after the write, before its `D` line) are
skipped, so each decision still has exactly one record.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

__all__ = ["CUT_BY_EXIT", "IntentJournal", "Leftovers", "read_leftovers", "settle_leftovers", "trail_line"]

log = structlog.get_logger("sandgate.audit")

CUT_BY_EXIT = "cut by worker exit"
_PREFIX = "intents-"
_RESERVED, _EMITTED, _DONE = b"R ", b"E ", b"D "


class IntentJournal:
    """This process's journal of intents; `add` before anything goes upstream, `done` once written."""

    def __init__(self, folder: Path, *, compact_bytes: int = 1 << 20, pid: int | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = folder / f"{_PREFIX}{pid or os.getpid()}.log"
        self._compact_bytes = compact_bytes
        self._lock = threading.Lock()
        self._open: dict[str, bytes] = {}  # decision id → its intent line
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o600)
        self._size = 0

    def add(self, decision_id: str, trail_line: str, *, reserved: bool) -> bytes | None:
        """Journal an intent, given as the record's trail line (JSON, ASCII, newline-terminated):
        the intent as journaled (for `restore`), or None when it could not be written (the
        caller fails closed). An intent open for that id already is replaced."""
        line = (_RESERVED if reserved else _EMITTED) + trail_line.encode("ascii")
        with self._lock:
            return line if self._append(decision_id, line) else None

    def current(self, decision_id: str) -> bytes | None:
        """The open intent of `decision_id` as journaled (for `restore`), or None."""
        with self._lock:
            return self._open.get(decision_id)

    def restore(self, decision_id: str, line: bytes, *, over: bytes) -> bool:
        """Journal `line` (as `current` gave it) as the open intent of `decision_id` again, if
        `over` is still its open intent (else what replaced or closed it stands: nothing is
        written); False when it could not be written."""
        with self._lock:
            if self._open.get(decision_id) != over:
                return True
            return self._append(decision_id, line)

    def _append(self, decision_id: str, line: bytes) -> bool:
        if self._fd < 0:
            return False
        try:
            _write_all(self._fd, line)
        except OSError as e:
            log.error("audit.intent_failed", error=e.strerror, path=str(self.path))
            return False
        self._open[decision_id] = line
        self._size += len(line)
        return True

    def done(self, decision_ids: Iterable[str]) -> None:
        """These records were written (or given back): their intents are closed."""
        with self._lock:
            closed = [i for i in decision_ids if self._open.pop(i, None) is not None]
            if not closed or self._fd < 0:
                return
            line = _DONE + " ".join(closed).encode() + b"\n"
            try:
                _write_all(self._fd, line)
                self._size += len(line)
                if self._size >= self._compact_bytes:
                    self._compact()
            except OSError as e:
                # The intents stay open on disk: a death now writes records twice at worst,
                # and settle_leftovers skips those already in the trail.
                log.warning("audit.intent_done_failed", error=e.strerror)

    @property
    def open_intents(self) -> int:
        return len(self._open)

    def close(self) -> None:
        """Close the journal; removed when nothing is open (else kept for whoever settles it)."""
        with self._lock:
            if self._fd < 0:
                return
            os.close(self._fd)
            self._fd = -1
            if not self._open:
                with contextlib.suppress(OSError):
                    self.path.unlink()

    def _compact(self) -> None:
        """Rewrite the file with only the open intents (atomically: a death keeps one of them)."""
        data = b"".join(self._open.values())
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = len(data)


@dataclass(frozen=True)
class Leftovers:
    """The open intents a dead process left: records to write, in the order they were made."""

    path: Path
    pid: int
    records: list[dict[str, Any]]


def read_leftovers(folder: Path, alive: Callable[[int], bool]) -> list[Leftovers]:
    """The journals in `folder` whose process is gone, with their open intents as records."""
    found = []
    for path in sorted(folder.glob(f"{_PREFIX}*.log")):
        pid_text = path.name[len(_PREFIX) : -len(".log")]
        if not pid_text.isdigit() or alive(int(pid_text)):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        found.append(Leftovers(path, int(pid_text), _open_records(data)))
    return found


def _open_records(data: bytes) -> list[dict[str, Any]]:
    intents: dict[str, dict[str, Any]] = {}
    for line in data.split(b"\n")[:-1]:  # a torn last line was never a whole write
        kind, body = line[:2], line[2:]
        if kind == _DONE:
            for decision_id in body.decode(errors="replace").split():
                intents.pop(decision_id, None)
            continue
        try:
            record = json.loads(body)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("decision_id"), str):
            if kind == _RESERVED:
                record = {**record, "error": CUT_BY_EXIT, "status": None}
            intents[record["decision_id"]] = record
    return list(intents.values())


def settle_leftovers(
    leftovers: list[Leftovers],
    written: Callable[[set[str]], set[str]],
    write: Callable[[list[str]], None],
) -> int:
    """Write the open intents of dead processes as records (those not in the trail already,
    per `written`), then remove their journals; how many of the records written are requests
    the exit cut (the `R` intents: an `E` one, a tunnel's record, was complete as it was).
    OSError from `write` leaves the journals for the next try."""
    cut = 0
    for left in leftovers:
        ids = {r["decision_id"] for r in left.records}
        known = written(ids) if ids else set()
        records = [r for r in left.records if r["decision_id"] not in known]
        if records:
            write([trail_line(r) for r in records])
        cut_here = sum(1 for r in records if r.get("error") == CUT_BY_EXIT)
        cut += cut_here
        with contextlib.suppress(OSError):
            left.path.unlink()
        if ids:
            log.warning(
                "audit.cut_by_exit",
                pid=left.pid,
                records=len(records),
                cut=cut_here,
                already_written=len(ids) - len(records),
            )
    return cut


def trail_line(record: Mapping[str, Any]) -> str:
    """A record as its line in the trail (and in a journal): compact JSON, non-ASCII escaped,
    newline-terminated."""
    return json.dumps(record, separators=(",", ":"), default=str) + "\n"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    done = 0
    while done < len(data):
        done += os.write(fd, view[done:])
