"""An incremental server-sent events parser with bounded memory. No I/O.

`SseParser.feed(chunk)` takes bytes as they arrive, cut anywhere (inside a CRLF, inside a
multi-byte UTF-8 character), and returns the events completed by them, following the
WHATWG event-stream rules: lines end in CRLF, LF or CR; a blank line ends an event; a line
starting with `:` is a comment; `data` lines are joined with "\\n"; `event` names the type
(default `message`); `id` sets the last event id (kept across events, ignored when it holds
NUL); `retry` sets the reconnection time; one BOM at the start of the stream is dropped.

Memory is bounded: the partial line held between chunks is at most `max_line` characters
and an event's fields at most `max_event` characters; over either, `SseError` and the
parser refuses everything after (the stream is refused, never buffered without end). A
stream that is not UTF-8 is refused too (the spec would replace the bytes; a gateway
deciding on content must not read what the client reads differently).
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from sandgate.policy.protocols.errors import Problem, SseError

__all__ = ["SseEvent", "SseParser"]

_EOL = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event: its type, its data lines joined with "\\n", the last event id."""

    event: str
    data: str
    id: str | None = None


class SseParser:
    """Feed bytes in, take complete events out; see the module docstring."""

    def __init__(self, *, max_line: int = 1 << 20, max_event: int = 1 << 20) -> None:
        if max_line < 1 or max_event < 1:
            raise ValueError("max_line and max_event must be positive")
        self.max_line = max_line
        self.max_event = max_event
        self.retry: int | None = None
        self.last_event_id: str | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._pending: list[str] = []
        self._pending_size = 0
        self._after_cr = False
        self._at_start = True
        self._failed: SseError | None = None
        self._data: list[str] = []
        self._type = ""
        self._size = 0

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """The events completed by this chunk (SseError when the stream is over its bounds)."""
        if self._failed is not None:
            raise self._failed
        try:
            return self._feed_text(self._decode(chunk))
        except SseError as e:
            self._failed = e
            raise

    def close(self) -> None:
        """End of stream: an unfinished event is dropped (as the spec says); refuse a cut
        UTF-8 character."""
        if self._failed is not None:
            raise self._failed
        self._decode(b"", final=True)
        self._pending, self._pending_size, self._data = [], 0, []

    def _decode(self, chunk: bytes, *, final: bool = False) -> str:
        try:
            text = self._decoder.decode(chunk, final)
        except UnicodeDecodeError:
            raise SseError(Problem.INVALID_UTF8, "the event stream is not UTF-8") from None
        if self._at_start and text:
            self._at_start = False
            text = text.removeprefix("\ufeff")
        return text

    def _feed_text(self, text: str) -> list[SseEvent]:
        events: list[SseEvent] = []
        pos = 0
        if self._after_cr and text:
            # The LF of a CRLF cut between two chunks: the line already ended at the CR.
            pos = 1 if text[0] == "\n" else 0
            self._after_cr = False
        for m in _EOL.finditer(text, pos):
            self._hold(text, pos, m.start())
            line = "".join(self._pending)
            self._pending, self._pending_size = [], 0
            self._line(line, events)
            pos = m.end()
            self._after_cr = m[0] == "\r" and pos == len(text)
        self._hold(text, pos, len(text))
        return events

    def _hold(self, text: str, start: int, end: int) -> None:
        """Keep text[start:end] as part of the current line, within max_line."""
        if start == end:
            return
        self._pending_size += end - start
        if self._pending_size > self.max_line:
            raise SseError(Problem.LINE_TOO_LONG, f"a line over {self.max_line} characters")
        self._pending.append(text[start:end])

    def _line(self, line: str, events: list[SseEvent]) -> None:
        """Process one complete line."""
        if not line:
            self._dispatch(events)
            return
        if line.startswith(":"):
            return
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._grow(len(value) + 1)
            self._data.append(value)
        elif name == "event":
            self._grow(len(value) - len(self._type))
            self._type = value
        elif name == "id" and "\x00" not in value:
            self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)

    def _grow(self, size: int) -> None:
        self._size += size
        if self._size > self.max_event:
            raise SseError(Problem.EVENT_TOO_LARGE, f"an event over {self.max_event} characters")

    def _dispatch(self, events: list[SseEvent]) -> None:
        """A blank line: hand out the event being built (none when it has no data)."""
        if self._data:
            events.append(SseEvent(self._type or "message", "\n".join(self._data), self.last_event_id))
        self._data, self._type, self._size = [], "", 0
