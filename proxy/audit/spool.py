"""Records a worker could not hand to its collector, and what the trail already holds.

A worker whose supervisor died (so the collector with it) drains as on SIGTERM; the records it
still writes go to its spool (`spool-<pid>.jsonl` in its folder, fsynced per batch) instead of
waiting for a collector that is not coming back. The next supervisor merges every spool of a
process that is gone into the trail before its workers start, and then every so often (a worker
of the old gateway may still be draining when the new one starts): lines already in the trail
(a batch the dying collector wrote without acknowledging) are skipped, so each record lands
once, and the spool is removed.

`in_trail` answers "which of these are written" from the trail's tail: a process that died
wrote its last records moments before, so the newest few megabytes hold any of them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

import structlog

from sandgate.proxy.audit.files import audit_files

__all__ = ["SPOOL_PREFIX", "Spool", "ids_in_trail", "merge_spools"]

log = structlog.get_logger("sandgate.audit")

SPOOL_PREFIX = "spool-"
# How much of the trail's end is read for records a dead process may have written already.
TAIL_BYTES = 16 << 20
_ID = re.compile(rb'"decision_id":"([^"]+)"')


class Spool:
    """This process's spool: batches appended and fsynced, for the next supervisor to merge."""

    def __init__(self, folder: Path, pid: int | None = None) -> None:
        self.path = folder / f"{SPOOL_PREFIX}{pid or os.getpid()}.jsonl"
        self.records = 0

    def write(self, lines: list[str]) -> None:
        """Append the batch (whole: a cut one is cut back); OSError when it cannot."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            try:
                data = "".join(lines).encode()
                view, done = memoryview(data), 0
                while done < len(data):
                    done += os.write(fd, view[done:])
                os.fsync(fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)
        self.records += len(lines)


def _tail(audit_path: Path, limit: int = TAIL_BYTES) -> bytes:
    """The last `limit` bytes of the trail (the active file, then the newest rotated one)."""
    chunks: list[bytes] = []
    left = limit
    for path in audit_files(audit_path)[:2]:
        try:
            with path.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - left))
                data = f.read(left)
        except OSError:
            continue
        chunks.insert(0, data)
        left -= len(data)
        if left <= 0:
            break
    return b"".join(chunks)


def ids_in_trail(audit_path: Path, ids: set[str]) -> set[str]:
    """Which of `ids` the trail's tail already has a record for."""
    found = {m.group(1).decode(errors="replace") for m in _ID.finditer(_tail(audit_path))}
    return ids & found


def merge_spools(
    folders: list[Path], audit_path: Path, write: Callable[[list[str]], None], alive: Callable[[int], bool]
) -> int:
    """Merge the spools of processes that are gone into the trail through `write`; how many
    records were merged. OSError from `write` leaves the spool for the next try."""
    merged = 0
    for folder in folders:
        for path in sorted(folder.glob(f"{SPOOL_PREFIX}*.jsonl")):
            pid = path.name[len(SPOOL_PREFIX) : -len(".jsonl")]
            if not pid.isdigit() or alive(int(pid)):
                continue
            merged += _merge_one(path, audit_path, write)
    return merged


def _merge_one(path: Path, audit_path: Path, write: Callable[[list[str]], None]) -> int:
    data = path.read_bytes()
    lines = [line + "\n" for line in data.decode(errors="replace").split("\n")[:-1] if line]
    seen = {_digest(line) for line in _tail(audit_path).split(b"\n") if line}
    fresh = [line for line in lines if _digest(line[:-1].encode()) not in seen]
    if fresh:
        write(fresh)
    with contextlib.suppress(OSError):
        path.unlink()
    log.warning(
        "audit.spool_merged", spool=str(path), records=len(fresh), already_written=len(lines) - len(fresh)
    )
    return len(fresh)


def _digest(line: bytes) -> bytes:
    return hashlib.blake2b(line, digest_size=16).digest()
