"""A sink's disk queue: append-only segment files and a persisted read cursor.

`<folder>/<n>.seg` hold records (one JSON line each) in order; `<folder>/cursor` says where
the first undelivered record starts (`<segment> <offset>`), replaced atomically when a batch
was acknowledged. Segments wholly behind the cursor are deleted. At start a torn last line (a
crash mid-append) is cut and reading resumes at the cursor: what was not acknowledged is sent
again (at least once). `append` takes whole lines only while `pending_bytes` stays within the
bound; what does not fit is the caller's to drop or to wait with (see sink.py).

The two sides may be two processes (the gateway appends, its courier delivers: courier.py),
each with its own DiskQueue on the folder: the writer learns what was delivered from the
cursor file, the reader learns what was appended from the segments' sizes, and only whole
lines (ending in a newline) are ever read. Only the writer cuts a torn tail or appends; only
the reader moves the cursor and deletes segments.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Literal

import structlog

__all__ = ["DiskQueue", "Position", "Side"]

log = structlog.get_logger("sandgate.audit")

Position = tuple[int, int]  # (segment number, byte offset in it)
# Which side of the queue this process is: both (one process), the writer, or the reader.
Side = Literal["both", "writer", "reader"]

_SUFFIX = ".seg"
_READ_CHUNK = 1 << 20


class DiskQueue:
    """Records waiting for one sink's receiver, on disk under `folder`."""

    def __init__(
        self, folder: Path, *, max_bytes: int, segment_bytes: int = 16 << 20, side: Side = "both"
    ) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.side: Side = side
        self._segment_bytes = max(4096, min(segment_bytes, max_bytes // 4))
        self._lock = threading.Lock()
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._sizes: dict[int, int] = {}  # segment number → bytes of whole lines
        for path in folder.glob(f"*{_SUFFIX}"):
            with contextlib.suppress(ValueError):
                self._sizes[int(path.stem)] = path.stat().st_size
        if not self._sizes:
            self._sizes[1] = 0
        self._cursor = self._read_cursor()
        self._last = max(self._sizes)
        self._fd = -1
        if side != "reader":
            self._fd = os.open(self._path(self._last), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._cut_torn_tail()

    # -- state -------------------------------------------------------------------------------

    @property
    def pending_bytes(self) -> int:
        """Bytes appended and not yet acknowledged."""
        if self.side == "writer":
            self._follow_cursor()
        elif self.side == "reader":
            self._follow_segments()
        return self._pending()

    def _pending(self) -> int:
        """Bytes appended after the cursor as this side last knew it (a writer's may be behind
        the reader's: never fewer bytes than are really pending)."""
        with self._lock:
            seg, off = self._cursor
            return sum(size for n, size in self._sizes.items() if n >= seg) - off

    def _path(self, n: int) -> Path:
        return self.folder / f"{n:012d}{_SUFFIX}"

    def _read_cursor(self) -> Position:
        first = min(self._sizes)
        try:
            seg_text, off_text = (self.folder / "cursor").read_text().split()
            seg, off = int(seg_text), int(off_text)
        except (OSError, ValueError):
            return (first, 0)
        if seg not in self._sizes:
            return (first, 0) if seg < first else (max(self._sizes), 0)
        return (seg, min(off, self._sizes[seg]))

    def _follow_cursor(self) -> None:
        """The writer of a queue another process delivers: what that process acknowledged."""
        try:
            seg_text, off_text = (self.folder / "cursor").read_text().split()
            cursor = (int(seg_text), int(off_text))
        except (OSError, ValueError):
            return  # none yet, or being replaced: the last one read stands
        with self._lock:
            if cursor <= self._cursor:
                return
            self._cursor = cursor
            for n in [n for n in self._sizes if n < cursor[0]]:
                del self._sizes[n]  # the reader deleted it

    def _follow_segments(self) -> None:
        """The reader of a queue another process appends to: the segments' sizes now."""
        found: dict[int, int] = {}
        for path in self.folder.glob(f"*{_SUFFIX}"):
            with contextlib.suppress(ValueError, OSError):
                n = int(path.stem)
                if n >= self._cursor[0]:
                    found[n] = path.stat().st_size
        with self._lock:
            if found:
                self._sizes = (
                    found if self._cursor[0] in found else {**found, self._cursor[0]: self._cursor[1]}
                )
                self._last = max(self._sizes)

    def _cut_torn_tail(self) -> None:
        size = self._sizes[self._last]
        if size == 0:
            return
        with open(self._path(self._last), "rb") as f:
            f.seek(max(0, size - _READ_CHUNK))
            tail = f.read()
        end = size - len(tail) + tail.rfind(b"\n") + 1
        if end < size:
            log.error("audit.sink_queue_torn_tail", queue=str(self.folder), bytes=size - end)
            os.ftruncate(self._fd, end)
            self._sizes[self._last] = end

    # -- the writer's side -------------------------------------------------------------------

    def fitting(self, lines: list[str]) -> int:
        """How many of `lines` (from the first) fit under the bound now."""
        size = len("".join(lines).encode())
        if size <= self.max_bytes - self._pending():
            return len(lines)  # the common case: no look at the cursor file, no line by line
        room = self.max_bytes - self.pending_bytes
        count = 0
        for line in lines:
            room -= len(line.encode())
            if room < 0:
                break
            count += 1
        return count

    def append(self, lines: list[str], *, fsync: bool) -> None:
        """Append whole lines (and fsync when asked); on OSError nothing of them stays."""
        if not lines:
            return
        data = "".join(lines).encode()
        with self._lock:
            start = self._sizes[self._last]
            try:
                view = memoryview(data)
                done = 0
                while done < len(data):
                    done += os.write(self._fd, view[done:])
                if fsync:
                    os.fsync(self._fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, start)  # no torn line for the retry to repeat
                raise
            self._sizes[self._last] = start + len(data)
            if self._sizes[self._last] >= self._segment_bytes:
                self._roll()

    def _roll(self) -> None:
        """Start the next segment (lock held)."""
        os.close(self._fd)
        self._last += 1
        self._sizes[self._last] = 0
        self._fd = os.open(self._path(self._last), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    # -- the delivery thread's side ----------------------------------------------------------

    def read(self, max_lines: int) -> tuple[list[str], Position]:
        """Up to `max_lines` lines from the cursor, and the position after them."""
        if self.side == "reader":
            self._follow_segments()
        with self._lock:
            seg, off = self._cursor
            while off >= self._sizes[seg] and seg < self._last:
                seg, off = seg + 1, 0  # the rest of a finished segment was acknowledged
            size = self._sizes[seg]
        if off >= size:
            return [], (seg, off)
        want = min(size - off, _READ_CHUNK)
        with open(self._path(seg), "rb") as f:
            while True:
                f.seek(off)
                data = f.read(want)
                if data.count(b"\n") >= max_lines or want >= size - off:
                    break
                want = min(size - off, want * 2)  # long records: read further
        raw = data.split(b"\n")[:-1][:max_lines]
        span = sum(len(line) + 1 for line in raw)
        return [line.decode(errors="replace") + "\n" for line in raw], (seg, off + span)

    def commit(self, position: Position) -> None:
        """The receiver has everything before `position`: persist the cursor, free segments."""
        tmp = self.folder / "cursor.tmp"
        with open(tmp, "w") as f:
            f.write(f"{position[0]} {position[1]}\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.folder / "cursor")
        with self._lock:
            self._cursor = position
            gone = [n for n in self._sizes if n < position[0]]
            for n in gone:
                del self._sizes[n]
        for n in gone:
            self._path(n).unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                with contextlib.suppress(OSError):
                    os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1
