"""Where audit records are read from: the `Source` protocol and the rotated JSON-lines files.

`JsonlSource` reads `audit.jsonl` and its rotated copies (`audit.jsonl.1` newest rotated …
`audit.jsonl.N` oldest) line by line in bounded memory: a line longer than `MAX_LINE` is
skipped without being held whole. Lines that are not a JSON object are counted in
`malformed` and skipped. Lines the query's needles rule out are not decoded, only checked
for the shape of one JSON object (`{…}`), which catches truncated and foreign lines.
Files are opened newest first and told apart by inode, so a rotation during a read neither
skips nor repeats a file. A redis-stream source will implement the same protocol.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from sandgate.proxy.audit.query import AuditInputError, Query, Record, line_filter, record_time

__all__ = ["MAX_LINE", "JsonlSource", "Source", "audit_files", "reverse_lines"]

MAX_LINE = 1 << 20
CHUNK = 1 << 16
# Records reach the file in queue order, which can trail their `time` by the writer's
# max_wait: a file is skipped for a time window only when it is this far outside it.
WINDOW_SLACK = timedelta(minutes=10)


class Source(Protocol):
    """Audit records of one gateway.

    `malformed` counts lines that could not be read; `gaps` counts the times `follow` fell so
    far behind (rotation past the last backup, a trimmed stream) that records may be missing.
    """

    malformed: int
    gaps: int

    def records(self, query: Query) -> Generator[Record, None, None]:
        """Every selected record, oldest first."""
        ...

    def latest(self, query: Query, n: int) -> list[Record]:
        """The newest `n` selected records, oldest first; `follow` continues after them."""
        ...

    def follow(self, query: Query, stop: threading.Event) -> Generator[Record, None, None]:
        """Selected records as they are appended, until `stop` is set."""
        ...


@dataclass(slots=True)
class _Opened:
    """One audit file, open: `live` when it is the file the gateway appends to."""

    file: BinaryIO
    live: bool


def audit_files(path: Path) -> list[Path]:
    """The audit file and its rotated copies that exist, newest first."""
    rotated: list[tuple[int, Path]] = []
    prefix = path.name + "."
    if path.parent.is_dir():
        for entry in path.parent.iterdir():
            suffix = entry.name.removeprefix(prefix)
            if entry.name.startswith(prefix) and suffix.isdigit() and entry.is_file():
                rotated.append((int(suffix), entry))
    newest = [path] if path.is_file() else []
    return newest + [p for _, p in sorted(rotated)]


def reverse_lines(f: BinaryIO, end: int) -> Iterator[bytes | None]:
    """The lines of `f` before offset `end`, last first, without newlines; None for an overlong line."""
    pos, tail, overlong = end, b"", False
    while pos > 0:
        size = min(CHUNK, pos)
        pos -= size
        f.seek(pos)
        pieces = f.read(size).split(b"\n")
        if len(pieces) == 1:
            tail = b"" if overlong else pieces[0] + tail
            if len(tail) > MAX_LINE:
                tail, overlong = b"", True
            continue
        last = pieces[-1] + tail
        yield None if overlong or len(last) > MAX_LINE else last
        overlong = False
        for piece in reversed(pieces[1:-1]):
            yield piece if len(piece) <= MAX_LINE else None
        tail = pieces[0]
    if tail or overlong:
        yield None if overlong else tail


def forward_lines(f: BinaryIO) -> Iterator[bytes | None]:
    """The lines of `f` from its position, in order; None for an overlong line (skipped in pieces)."""
    while line := f.readline(MAX_LINE):
        if len(line) == MAX_LINE and not line.endswith(b"\n"):
            while (rest := f.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                pass
            yield None
            continue
        yield line


def decode(line: bytes) -> dict[str, Any] | None:
    """A line as a JSON object, or None."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _shaped(line: bytes) -> bool:
    """Whether a line looks like one JSON object (`{…}`): how lines that are not decoded are checked."""
    return line.startswith(b"{") and (line.endswith((b"}\n", b"}")) or line.rstrip().endswith(b"}"))


def last_newline_end(f: BinaryIO, size: int) -> int:
    """The offset just after the last newline before `size` (0 when there is none)."""
    pos = size
    while pos > 0:
        start = max(0, pos - CHUNK)
        f.seek(start)
        found = f.read(pos - start).rfind(b"\n")
        if found != -1:
            return start + found + 1
        pos = start
    return 0


class LineBuffer:
    """Splits appended bytes into lines; a line longer than MAX_LINE comes out as None, unheld."""

    def __init__(self) -> None:
        self._pending = b""
        self._overlong = False

    def feed(self, data: bytes) -> list[bytes | None]:
        """The lines that `data` completes."""
        *complete, rest = (self._pending + data).split(b"\n")
        out: list[bytes | None] = []
        for line in complete:
            out.append(None if self._overlong or len(line) > MAX_LINE else line)
            self._overlong = False
        if self._overlong or len(rest) > MAX_LINE:
            self._pending, self._overlong = b"", True
        else:
            self._pending = rest
        return out

    def finish(self) -> list[bytes | None]:
        """The unterminated last line, if any."""
        if self._overlong:
            return [None]
        return [self._pending] if self._pending else []


class JsonlSource:
    """The JSON-lines audit trail at `path` and its rotated copies."""

    def __init__(self, path: Path, *, poll_seconds: float = 0.2) -> None:
        self.path = path
        self.malformed = 0
        self.gaps = 0
        self._poll = poll_seconds
        # Where `latest` stopped: the live file's (device, inode) and offset.
        self._resume: tuple[tuple[int, int] | None, int] | None = None

    def records(self, query: Query) -> Generator[Record, None, None]:
        """Every selected record, oldest file first, line by line."""
        may_match = line_filter(query)
        with ExitStack() as stack:
            for opened in reversed(self._snapshot(stack)):
                if query.windowed and not _may_overlap(opened.file, query):
                    continue
                opened.file.seek(0)
                yield from self._select(forward_lines(opened.file), query, may_match, live=opened.live)

    def latest(self, query: Query, n: int) -> list[Record]:
        """The newest `n` selected records, read backwards from the end of the newest file."""
        may_match = line_filter(query)
        found: list[Record] = []
        self._resume = (None, 0)  # no live file yet: follow it from its start once it appears
        with ExitStack() as stack:
            for opened in self._snapshot(stack):
                end = os.fstat(opened.file.fileno()).st_size
                if opened.live:
                    # A line still being written is left to `follow`, which starts here.
                    end = last_newline_end(opened.file, end)
                    self._resume = (_inode(opened.file), end)
                if len(found) >= n:
                    break
                for record in self._select(reverse_lines(opened.file, end), query, may_match, live=False):
                    found.append(record)
                    if len(found) == n:
                        break
        return found[::-1]

    def follow(self, query: Query, stop: threading.Event) -> Generator[Record, None, None]:
        """Selected records appended after `latest` (or from now), reopening after a rotation."""
        may_match = line_filter(query)
        current, lines = self._start_following(), LineBuffer()
        try:
            while not stop.is_set():
                data = current.read(CHUNK) if current else b""
                if data:
                    yield from self._select(lines.feed(data), query, may_match, live=False)
                    continue
                replacement = self._replacement(current)
                if replacement is not None:
                    if current is not None:
                        yield from self._drain(current, lines, query, may_match)
                        for missed in self._rotated_between(current, replacement):
                            with missed:
                                yield from self._drain(missed, LineBuffer(), query, may_match)
                        current.close()
                    current, lines = replacement, LineBuffer()
                    continue
                if current is not None and os.fstat(current.fileno()).st_size < current.tell():
                    current.seek(0)  # truncated in place (copytruncate)
                    lines = LineBuffer()
                stop.wait(self._poll)
        finally:
            if current is not None:
                current.close()

    def _snapshot(self, stack: ExitStack) -> list[_Opened]:
        """The audit files, opened newest first, each inode once; raises when there is none."""
        opened: list[_Opened] = []
        seen: set[tuple[int, int]] = set()
        for path in audit_files(self.path):
            try:
                f = stack.enter_context(path.open("rb"))
            except FileNotFoundError:
                continue  # rotated away between listing and opening
            if _inode(f) not in seen:
                seen.add(_inode(f))
                opened.append(_Opened(f, live=path == self.path))
        if not opened:
            raise AuditInputError(f"no audit file at {self.path}")
        return opened

    def _select(
        self,
        lines: Iterable[bytes | None],
        query: Query,
        may_match: Callable[[bytes], bool],
        *,
        live: bool,
    ) -> Iterator[Record]:
        """The selected records among raw lines, counting the malformed ones."""
        for line in lines:
            if line is None:
                self.malformed += 1
                continue
            if may_match(line):
                record = decode(line)
                if record is not None:
                    if query.matches(record):
                        yield record
                    continue
            elif _shaped(line):
                continue  # ruled out by the needles, not decoded
            # Blank lines are no records; the live file's last line may still be being written.
            if line.strip() and not (live and not line.endswith(b"\n")):
                self.malformed += 1

    def _start_following(self) -> BinaryIO | None:
        """The file and position where `latest` stopped (found by inode), or the live file's end."""
        if self._resume is None:
            try:
                f = self.path.open("rb")
            except FileNotFoundError:
                return None
            f.seek(last_newline_end(f, os.fstat(f.fileno()).st_size))
            return f
        inode, pos = self._resume
        self._resume = None
        if inode is None:
            return None
        # Twice: a rotation between a listing and the opens renames the file out of the first.
        for _ in range(2):
            for path in audit_files(self.path):
                try:
                    f = path.open("rb")
                except FileNotFoundError:
                    continue
                if _inode(f) == inode:
                    f.seek(pos)
                    return f
                f.close()
        self.gaps += 1  # rotated past the last backup since `latest`: the live file from its start
        return None

    def _replacement(self, current: BinaryIO | None) -> BinaryIO | None:
        """The audit file, newly opened, when it is no longer the inode being read; else None."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None  # between rename and re-create: keep the old one
        if current is not None and _inode(current) == (st.st_dev, st.st_ino):
            return None
        try:
            return self.path.open("rb")
        except FileNotFoundError:
            return None

    def _rotated_between(self, old: BinaryIO, new: BinaryIO) -> list[BinaryIO]:
        """Files rotated after `old` and before `new` became the live file, oldest first, open.

        More than one rotation between two polls leaves files that were never live while
        followed; when `old` is no longer among the rotated files, records may be lost (a gap).
        """
        seen, newer = _inode(old), list[BinaryIO]()
        for path in audit_files(self.path):
            if path == self.path:
                continue
            try:
                f: BinaryIO = path.open("rb")
            except FileNotFoundError:
                continue
            if _inode(f) == seen:
                f.close()
                return newer[::-1]
            if _inode(f) == _inode(new):
                f.close()
            else:
                newer.append(f)
        for unused in newer:
            unused.close()
        self.gaps += 1
        return []

    def _drain(
        self, f: BinaryIO, lines: LineBuffer, query: Query, may_match: Callable[[bytes], bool]
    ) -> Iterator[Record]:
        """What was appended to a rotated-away file since the last read, its last partial line too."""
        while data := f.read(CHUNK):
            yield from self._select(lines.feed(data), query, may_match, live=False)
        yield from self._select(lines.finish(), query, may_match, live=False)


def _inode(f: BinaryIO) -> tuple[int, int]:
    """What identifies an open file across renames."""
    st = os.fstat(f.fileno())
    return st.st_dev, st.st_ino


def _may_overlap(f: BinaryIO, query: Query) -> bool:
    """Whether a file's records can fall in the query's window, judged by its first and last line."""
    f.seek(0)
    first = decode(f.readline(MAX_LINE))
    ends = (line for line in reverse_lines(f, os.fstat(f.fileno()).st_size) if line is None or line.strip())
    last_line = next(ends, None)
    last = decode(last_line) if last_line else None
    start = record_time(first) if first else None
    end = record_time(last) if last else None
    if query.since is not None and end is not None and end < query.since - WINDOW_SLACK:
        return False
    return not (query.until is not None and start is not None and start > query.until + WINDOW_SLACK)
