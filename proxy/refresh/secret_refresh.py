"""Keep the broker's scrubbers knowing every secret the tenants can inject, from the first request.

One background task runs `Broker.refresh()`: at start, when poked (stored credentials changed),
and every `interval` seconds (a `file:` secret replaced on disk, a `cmd:` value past its TTL).
Each source keeps its own cache, so a refresh costs a stat per secret file and no store round
trip; it never runs on the request path.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from sandgate.brokers import Broker
from sandgate.proxy.tasks import BackgroundTask

__all__ = ["SecretRefresher"]

log = structlog.get_logger("sandgate.credentials")


class SecretRefresher:
    """Runs `broker.refresh()` now, on `poke()`, and every `interval` seconds."""

    def __init__(self, broker: Broker, *, interval: float) -> None:
        self.broker = broker
        self.interval = interval
        self._wake = asyncio.Event()
        self._task = BackgroundTask("sandgate-secret-refresh", self._run)

    def start(self) -> None:
        self._task.start()

    def poke(self) -> None:
        """Refresh now (called from the event loop)."""
        self._wake.set()

    async def stop(self) -> None:
        await self._task.stop()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.broker.refresh()
            except Exception:  # a dead refresher would leave new secrets unscrubbed
                log.exception("credentials.refresh_failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
