"""The trail's one writer with SIEM sinks behind it: the file first, then each sink's queue.

Used where a single `AuditSink` is expected (the workers' collector, the records settled at
start). The file's OSError goes to the caller (who retries the batch, which the file writes
once); a sink's queue that fails after the file took the batch is retried here with backoff
rather than reported, so a retry never writes the file twice and no sink loses the batch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog

from sandgate.proxy.audit.sinks.sink import SiemSink

if TYPE_CHECKING:
    from sandgate.proxy.audit.trail import AuditSink

__all__ = ["Fanout"]

log = structlog.get_logger("sandgate.audit")

_MAX_DELAY = 5.0


class Fanout:
    """`primary` (the file), then `sinks`, for every batch."""

    def __init__(self, primary: AuditSink, sinks: Sequence[SiemSink]) -> None:
        self.primary = primary
        self.sinks = list(sinks)
        self._closed = threading.Event()

    def start(self) -> None:
        for sink in self.sinks:
            sink.start()

    def write(self, lines: list[str]) -> None:
        self.primary.write(lines)
        self.queue(lines)

    def queue(self, lines: list[str]) -> None:
        """Append `lines` to every sink's queue, retrying one whose disk fails."""
        for sink in self.sinks:
            delay = 0.05
            while True:
                try:
                    sink.write(lines)
                    break
                except OSError as e:
                    if self._closed.is_set():
                        log.error("audit.sink_unqueued", sink=sink.name, records=len(lines), error=e.strerror)
                        break
                    log.error("audit.sink_queue_failed", sink=sink.name, error=e.strerror, retry_in=delay)
                    self._closed.wait(delay)
                    delay = min(delay * 2, _MAX_DELAY)

    def close(self) -> None:
        self._closed.set()
        try:
            self.primary.close()
        finally:
            for sink in self.sinks:
                sink.close()
