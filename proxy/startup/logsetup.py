"""structlog configuration: one process-wide setup, JSON or console, to standard error.

Warnings and errors that repeat are rate-limited (`RepeatLimiter`): a fault that fires per
connection (accept failing with EMFILE wrote 868,050 lines in 40 s) must not flood the log.
At most `REPEAT_BURST` lines of one kind pass per `REPEAT_WINDOW_SECONDS`; the next line of
that kind after a quiet spell carries `suppressed=N`. Info lines (one `egress.decision` per
audit record) are never limited: they are the decision log.

Log lines never carry wire bytes. mitmproxy's own messages quote what it could not parse
(`Invalid header line: b'...'`, a buffer, a GOAWAY's debug data), which can hold a secret an
upstream reflected: in every line that does not come from sandgate, quoted literals
(bytes or strings) are replaced by a marker. Tracebacks are plain (never with locals).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import MutableMapping
from typing import Any

import structlog

__all__ = ["RepeatLimiter", "configure_logging", "redact_literals"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
# A Python repr of bytes or a string: b'...', b"...", '...', "..." (escapes included).
_LITERAL = re.compile(r"(?<!\w)b?'(?:[^'\\\n]|\\.)*'|(?<!\w)b?\"(?:[^\"\\\n]|\\.)*\"")
_BARE_BYTES = re.compile(r"""bytearray\(b?['"].*?['"]\)""")
_MARKER = "<redacted>"


def redact_literals(text: str) -> str:
    """`text` with every quoted literal replaced by a marker, and no control characters."""
    text = _BARE_BYTES.sub(_MARKER, text)
    text = _LITERAL.sub(_MARKER, text)
    return "".join(c if c.isprintable() or c == "\n" else "?" for c in text)


class _WireSafeFormatter(logging.Formatter):
    """Formats standard-library records; a foreign (mitmproxy) line loses its quoted bytes."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if record.name.startswith("sandgate"):
            return line
        return redact_literals(line)


def _redact_exception(
    _logger: object, _name: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """An exception's message can quote what failed to parse: redact literals in it too."""
    exception = event_dict.get("exception")
    if isinstance(exception, str):
        event_dict["exception"] = redact_literals(exception)
    return event_dict


REPEAT_WINDOW_SECONDS = 10.0
REPEAT_BURST = 5
# Kinds remembered at once; past it, kinds whose window ended are forgotten (bounded memory).
_MAX_KINDS = 1024
_STRUCTLOG_LIMITED = {"warning", "warn", "error", "exception", "critical", "fatal"}
_DIGITS = re.compile(r"\d+")


class RepeatLimiter:
    """Per kind of line: `burst` lines per `window` seconds; counts what it drops. Thread-safe."""

    def __init__(self, window: float = REPEAT_WINDOW_SECONDS, burst: int = REPEAT_BURST) -> None:
        self.window = window
        self.burst = burst
        self._lock = threading.Lock()
        # kind -> [window start, lines passed in it, lines suppressed not yet reported]
        self._kinds: dict[tuple[object, ...], list[float]] = {}

    def check(self, kind: tuple[object, ...], now: float | None = None) -> int | None:
        """None: drop this line. Else the count of suppressed lines it must report (often 0)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            state = self._kinds.get(kind)
            if state is None:
                if len(self._kinds) >= _MAX_KINDS:
                    self._forget(now)
                state = self._kinds[kind] = [now, 0, 0]
            elif now - state[0] >= self.window:
                state[0], state[1] = now, 0
            if state[1] >= self.burst:
                state[2] += 1
                return None
            state[1] += 1
            suppressed, state[2] = int(state[2]), 0
            return suppressed

    def _forget(self, now: float) -> None:
        for kind in [k for k, s in self._kinds.items() if now - s[0] >= self.window and not s[2]]:
            del self._kinds[kind]
        if len(self._kinds) >= _MAX_KINDS:
            self._kinds.clear()  # a flood of distinct kinds: start over rather than grow

    def processor(
        self, _logger: Any, method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        """structlog processor: limits warnings and errors per (event, level)."""
        if method not in _STRUCTLOG_LIMITED:
            return event_dict
        suppressed = self.check(("structlog", event_dict.get("event"), method))
        if suppressed is None:
            raise structlog.DropEvent
        if suppressed:
            event_dict["suppressed"] = suppressed
        return event_dict


class _RepeatFilter(logging.Filter):
    """The standard library's side (mitmproxy's and asyncio's logs), per (logger, level, message shape)."""

    def __init__(self, limiter: RepeatLimiter) -> None:
        super().__init__()
        self.limiter = limiter

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        shape = _DIGITS.sub("N", str(record.msg))[:120]
        suppressed = self.limiter.check(("logging", record.name, record.levelno, shape))
        if suppressed is None:
            return False
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} similar lines suppressed)"
        return True


def configure_logging(level: str = "info", fmt: str = "console") -> None:
    """Route structlog and the standard library (mitmproxy's own logs) to stderr."""
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)
    )
    limiter = RepeatLimiter()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            limiter.processor,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _redact_exception,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # One write per line (print() writes the newline apart): the workers of one gateway share
        # its stderr, and a line split by another process's line is no JSON for a log shipper.
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # mitmproxy logs URLs (which may carry secrets in query strings) at info: keep it to warnings.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_WireSafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_RepeatFilter(limiter))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
