"""The repeated-line limiter: a fault that fires per connection must not flood the log."""

from __future__ import annotations

import logging

import pytest
import structlog

from sandgate.proxy.logsetup import RepeatLimiter, _RepeatFilter


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
