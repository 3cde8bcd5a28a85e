"""The log setup: repeated lines are limited, mitmproxy's lines lose wire bytes, tracebacks are plain."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from sandgate.proxy.startup.logsetup import RepeatLimiter, _RepeatFilter, configure_logging, redact_literals


def test_a_kind_of_line_passes_its_burst_then_is_dropped_and_counted() -> None:
    limiter = RepeatLimiter(window=10, burst=3)
    passed = [limiter.check(("accept failed",), now=100 + i * 0.01) for i in range(1000)]
    assert passed[:3] == [0, 0, 0]
    assert passed[3:] == [None] * 997
    # After the window, the next line passes and says how many were dropped.
    assert limiter.check(("accept failed",), now=111) == 997
    assert limiter.check(("accept failed",), now=111.1) == 0


def test_kinds_are_limited_separately() -> None:
    limiter = RepeatLimiter(window=10, burst=1)
    assert limiter.check(("a",), now=1) == 0
    assert limiter.check(("a",), now=2) is None
    assert limiter.check(("b",), now=2) == 0


def test_many_distinct_kinds_do_not_grow_memory_without_bound() -> None:
    limiter = RepeatLimiter(window=10, burst=1)
    for i in range(10_000):
        limiter.check(("kind", i), now=1.0)
    assert len(limiter._kinds) <= 1024


@pytest.mark.parametrize("method", ["warning", "error", "exception"])
def test_the_structlog_processor_drops_repeats_of_warnings_and_errors(method: str) -> None:
    limiter = RepeatLimiter(window=60, burst=2)
    for _ in range(2):
        assert limiter.processor(None, method, {"event": "hook_failed"}) == {"event": "hook_failed"}
    with pytest.raises(structlog.DropEvent):
        limiter.processor(None, method, {"event": "hook_failed"})


def test_info_lines_are_never_limited() -> None:
    limiter = RepeatLimiter(window=60, burst=1)
    for _ in range(100):
        assert limiter.processor(None, "info", {"event": "egress.decision"}) == {"event": "egress.decision"}


def test_the_logging_filter_limits_by_logger_and_message_shape() -> None:
    filt = _RepeatFilter(RepeatLimiter(window=60, burst=2))

    def record(msg: str, level: int = logging.ERROR) -> logging.LogRecord:
        return logging.LogRecord("mitmproxy.master", level, __file__, 1, msg, None, None)

    # Messages that differ only in numbers (ports, counts) are one kind.
    results = [filt.filter(record(f"Unhandled error in task {i}.")) for i in range(50)]
    assert results == [True, True] + [False] * 48
    assert filt.filter(record("client connect", logging.INFO))


SECRET = "sk-live-LOGGED-0123456789abcdef"


@pytest.fixture
def logging_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


@pytest.mark.parametrize(
    "message",
    [
        f"Cannot parse HTTP response: Invalid header line: b'Bearer {SECRET}'",
        f'unexpected server response: b"HTTP/1.1 200 OK\\r\\nX: {SECRET}"',
        f"HTTP/2 connection closed: <ConnectionTerminated error_code:1, additional_data:b'{SECRET}'>",
        f"Received multiple content-length headers: [b'5', b'{SECRET}'] from server, refusing",
        f"Client closed connection before completing request headers: bytearray(b'{SECRET}')",
    ],
    ids=["a bad header line", "a raw buffer", "a GOAWAY's debug data", "a header list", "a bytearray"],
)
def test_a_mitmproxy_line_quoting_wire_bytes_is_logged_without_them(
    message: str, logging_restored: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("info", "json")
    logging.getLogger("mitmproxy.proxy.server").warning(message)
    err = capsys.readouterr().err
    assert "mitmproxy.proxy.server" in err and "<redacted>" in err
    assert SECRET not in err


def test_an_exception_logged_by_sandgate_has_no_locals_and_no_quoted_bytes(
    logging_restored: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("info", "console")
    log = structlog.get_logger("sandgate.test")

    def parse(line: bytes) -> None:
        hidden = SECRET + "-local"  # a local a locals-printing formatter would show
        raise ValueError(f"Invalid header line: {line!r} {len(hidden)}")

    try:
        parse(f"Bearer {SECRET}".encode())
    except ValueError:
        log.exception("hook_failed", hook="test")
    err = capsys.readouterr().err
    assert "Traceback" in err and "hook_failed" in err
    assert SECRET not in err


def test_redaction_keeps_the_words_around_the_literals() -> None:
    assert (
        redact_literals("Client's cert for 'h.test' failed: b'x'")
        == "Client's cert for <redacted> failed: <redacted>"
    )
    assert redact_literals("line\x1b[31m") == "line?[31m"


WRITER = """
import sys
import structlog
from sandgate.proxy.startup.logsetup import configure_logging
configure_logging("info", "json")
log = structlog.get_logger("t")
for i in range(int(sys.argv[1])):
    log.info("policy.reloaded", worker=sys.argv[2], i=i, pad="x" * 200)
"""


def test_processes_sharing_stderr_never_split_each_other_s_lines(tmp_path: Path) -> None:
    # A gateway's workers inherit one stderr: each JSON line must reach it in one write, or a
    # log shipper reads two half lines (seen: a worker's line ran into its peer's).
    out = tmp_path / "shared.log"
    with out.open("wb") as shared:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WRITER, "3000", str(w)],
                stderr=shared,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            for w in range(3)
        ]
        assert [p.wait(120) for p in procs] == [0, 0, 0]
    lines = out.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is one whole record
    assert len(records) == 9000
