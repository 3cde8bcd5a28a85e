"""A SIEM sink as the audit writer sees it: `write` appends to the sink's disk queue and returns.

It never waits on the network: the delivery thread (delivery.py) sends what is queued. When
the queue is full (`max_spool_bytes`), `when_full` decides:
- `drop_newest` (default): the records that do not fit are not queued for this sink. They
  stay in the local trail, which remains the source of truth (`sandgate audit` reads them,
  and an operator can replay them); counted (`dropped`, why=full) and logged once per episode.
- `block`: `write` waits for room, which holds the audit writer: its queue fills and
  decisions wait for a place, then deny (`internal_error`). For operators whose SIEM must be
  complete even at the price of traffic.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Literal

import structlog

from sandgate.proxy.audit.sinks.delivery import Counters, Delivery
from sandgate.proxy.audit.sinks.figures import DELIVERY_FILE, FIGURES_FILE
from sandgate.proxy.audit.sinks.queue import DiskQueue, Side
from sandgate.proxy.audit.sinks.transport import Transport
from sandgate.proxy.metrics import SinkFigures

__all__ = ["SiemSink"]

log = structlog.get_logger("sandgate.audit")


_FIGURES_EVERY = 1.0  # seconds between two writes of the figures file


class SiemSink:
    """One configured sink: its queue, its delivery thread, its counts."""

    def __init__(
        self,
        name: str,
        kind: str,
        folder: Path,
        transport: Transport,
        *,
        fmt: Literal["native", "ocsf"],
        max_bytes: int,
        when_full: Literal["drop_newest", "block"],
        batch_size: int,
        max_backoff: float,
        fsync: bool,
        linger: float = 0.0,
        side: Side = "both",
    ) -> None:
        self.name, self.kind = name, kind
        # "writer": another process (the courier) delivers; "reader": this one only delivers.
        self.side: Side = side
        self.queue = DiskQueue(folder, max_bytes=max_bytes, side=side)
        self.counters = Counters()
        self._when_full = when_full
        self._fsync = fsync
        self._room = threading.Condition()
        self._closed = False
        self._dropping = 0  # records dropped in the current full episode
        self._figures_at = 0.0
        self.delivery = Delivery(
            name,
            self.queue,
            transport,
            fmt=fmt,
            batch_size=batch_size,
            max_backoff=max_backoff,
            linger=linger,
            counters=self.counters,
            committed=self._freed,
        )
        self.delivery.on_idle = self.save_figures

    def __repr__(self) -> str:
        return f"SiemSink({self.name!r}, {self.kind})"

    def start(self) -> None:
        """Start delivering (a queue an earlier run left is sent first), unless the courier does."""
        if self.side != "writer":
            self.delivery.start()

    def write(self, lines: list[str]) -> None:
        """Queue the records; OSError (the queue's disk) has the audit writer retry the batch."""
        fit = self.queue.fitting(lines)
        while fit < len(lines) and self._when_full == "block" and not self._closed:
            if fit == 0 and self.queue.pending_bytes == 0:
                break  # a record larger than the whole queue: waiting would never end
            self.queue.append(lines[:fit], fsync=self._fsync)
            self._queued(fit)
            lines = lines[fit:]
            with self._room:
                self._room.wait(0.2)
            fit = self.queue.fitting(lines)
        self.queue.append(lines[:fit], fsync=self._fsync)
        self._queued(fit)
        if fit < len(lines):
            self._drop(len(lines) - fit)
        elif self._dropping:
            log.warning("audit.sink_full_ended", sink=self.name, dropped=self._dropping)
            self._dropping = 0
        if self.side == "writer":
            self.save_figures()  # no delivery thread here writes them (at most once a second)

    def _queued(self, count: int) -> None:
        if count:
            self.counters.spooled += count
            self.delivery.wake.set()

    def _drop(self, count: int) -> None:
        if not self._dropping:
            log.error(
                "audit.sink_full",
                sink=self.name,
                when_full=self._when_full,
                max_spool_bytes=self.queue.max_bytes,
                note="records stay in the local trail",
            )
        self._dropping += count
        self.counters.dropped_full += count

    def _freed(self) -> None:
        with self._room:
            self._room.notify_all()

    def close(self) -> None:
        """Send what is queued for a moment (the receiver answering), then stop; the rest is
        sent by the next run."""
        self._closed = True
        self._freed()
        if self.side != "writer":
            self.delivery.stop()
        self.queue.close()
        self.save_figures(force=True)

    def figures(self) -> SinkFigures:
        c = self.counters
        if self.side == "writer":
            c = self._delivered_elsewhere()
        oldest = c.oldest
        return SinkFigures(
            name=self.name,
            kind=self.kind,
            spooled=c.spooled,
            delivered=c.delivered,
            retried=c.retried,
            dropped_full=c.dropped_full,
            rejected=c.rejected,
            queue_bytes=self.queue.pending_bytes,
            oldest_seconds=max(0.0, time.time() - oldest) if oldest is not None else 0.0,
        )

    def _delivered_elsewhere(self) -> Counters:
        """This side's counts (spooled, dropped as full) with what the courier says it sent."""
        c = Counters()
        c.spooled, c.dropped_full = self.counters.spooled, self.counters.dropped_full
        try:
            sent = json.loads((self.queue.folder / DELIVERY_FILE).read_text())
            c.delivered, c.retried, c.rejected = (
                int(sent["delivered"]),
                int(sent["retried"]),
                int(sent["rejected"]),
            )
            c.oldest = float(sent["oldest"]) if sent.get("oldest") is not None else None
        except (OSError, ValueError, TypeError, KeyError):
            pass  # the courier has written none yet: nothing delivered by it
        return c

    def save_figures(self, *, force: bool = False) -> None:
        """Write the figures beside the queue (with workers the lead reads them for /metrics;
        a courier writes what it delivered, which the gateway adds to its own counts)."""
        now = time.monotonic()
        if not force and now - self._figures_at < _FIGURES_EVERY:
            return
        self._figures_at = now
        if self.side == "reader":
            c = self.counters
            sent = {
                "delivered": c.delivered,
                "retried": c.retried,
                "rejected": c.rejected,
                "oldest": c.oldest,
            }
            _replace(self.queue.folder / DELIVERY_FILE, json.dumps(sent), self.name)
            return
        _replace(self.queue.folder / FIGURES_FILE, json.dumps(self.figures()._asdict()), self.name)


def _replace(path: Path, text: str, sink: str) -> None:
    """Write `text` to `path` whole (readers never see half a file); a failure is logged."""
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("audit.sink_figures_unwritten", sink=sink, error=e.strerror)
