"""Audit records for connections refused at connect, aggregated so a flood is no audit flood.

One record per refused connection would let anyone who can connect write audit lines (and
`egress.decision` log lines) as fast as they can open sockets. Instead, refusals are counted
per (source, limit) and window (1 s), and each window that counted any becomes one record at
its end, with `connections` saying how many refusals it stands for: a steady flood from one
source costs one record a second, and a single refusal is recorded within a second. Past
`max_keys` distinct sources in one window, further sources share one catch-all key (`*`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from sandgate.proxy.tasks import BackgroundTask

__all__ = ["RefusalAudit"]

log = structlog.get_logger("sandgate.refusals")

Record = dict[str, Any]


@dataclass(slots=True)
class _Window:
    count: int
    # Builds the record of `count` refusals from `source` (the record's `connections` field).
    make: Callable[[str, int], Record]


class RefusalAudit:
    """Aggregates refusals per (source, limit) and window; `run` flushes the windows."""

    def __init__(
        self,
        emit: Callable[[Record], Awaitable[bool]],
        *,
        window: float = 1.0,
        max_keys: int = 1024,
    ) -> None:
        self._emit = emit
        self.window = window
        self._max_keys = max_keys
        self._windows: dict[tuple[str, str], _Window] = {}
        self._task = BackgroundTask("sandgate-refusal-audit", self._run)

    def refused(self, source: str, limit: str, make: Callable[[str, int], Record]) -> None:
        """Count one refusal; `make(source, count)` builds the record when the window is flushed."""
        key = (source, limit)
        if key not in self._windows and len(self._windows) >= self._max_keys:
            key = ("*", limit)
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = _Window(0, make)
        window.count += 1
        window.make = make

    async def flush(self) -> None:
        """Record each window's count as one record, and start new windows."""
        windows, self._windows = self._windows, {}
        for (source, _limit), w in windows.items():
            await self._emit(w.make(source, w.count))

    def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()
        await self.flush()  # what was counted is still recorded

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.window)
            try:
                await self.flush()
            except Exception:
                log.exception("refusal_audit.flush_failed")
