"""Tell the gateway's `stored:` cache that stored credentials changed.

Fleet: a subscription to `<prefix>events`; the message `credentials` drops the cache. When the
subscription is lost it is re-made with backoff, and the cache is dropped once it is back
(events may have been missed meanwhile). One machine: the sealed file is polled (a stat in a
worker thread each interval) and the cache dropped when it was replaced. Neither is on the
request path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog
from redis.exceptions import RedisError

from sandgate.brokers.sources.stored import StoredSource
from sandgate.proxy.redis.outage import REDIS_OUTAGE
from sandgate.proxy.stores.credentials import RekeyableStore
from sandgate.proxy.stores.credentials_file import FileCredentialStore
from sandgate.proxy.stores.credentials_redis import CHANGE_MESSAGE, RedisCredentialStore
from sandgate.proxy.tasks import BackgroundTask

__all__ = ["CredentialWatcher"]

log = structlog.get_logger("sandgate.credentials")

MAX_BACKOFF_SECONDS = 5.0


class CredentialWatcher:
    """Runs one background task that invalidates `source` when the store changes."""

    def __init__(self, store: RekeyableStore, source: StoredSource, *, interval: float = 1.0) -> None:
        self.store = store
        self.source = source
        self.interval = interval
        self._task: BackgroundTask | None = None

    def start(self) -> None:
        if self._task is not None:
            return
        watch: Callable[[], Awaitable[None]]
        if isinstance(self.store, RedisCredentialStore):
            watch = self._watch_redis
        elif isinstance(self.store, FileCredentialStore):
            watch = self._watch_file
        else:
            return
        self._task = BackgroundTask("sandgate-credential-watch", watch)
        self._task.start()

    async def stop(self) -> None:
        if self._task is not None:
            await self._task.stop()
            self._task = None

    async def _watch_file(self) -> None:
        assert isinstance(self.store, FileCredentialStore)
        store = self.store
        last: object = None
        first = True
        while True:
            if not first:
                await asyncio.sleep(self.interval)
            try:
                stamp = await asyncio.to_thread(store.stamp)
            except OSError as e:
                log.warning("credentials.watch_failed", path=str(store.path), error=e.strerror)
                continue
            if first:
                last, first = stamp, False
            elif stamp != last:
                last = stamp
                self.source.invalidate()
                log.info("credentials.changed", store="file")

    def _reconnected(self, _connection: object) -> None:
        self.source.invalidate()
        log.info("credentials.watch_reconnected")

    async def _watch_redis(self) -> None:
        assert isinstance(self.store, RedisCredentialStore)
        store = self.store
        backoff = 0.1
        while True:
            pubsub = store.client.pubsub()
            try:
                await pubsub.subscribe(store.channel)
                REDIS_OUTAGE.reached("credentials.watch")
                # Subscribed: whatever changed while we were not is read afresh. redis-py also
                # reconnects and resubscribes on its own (no exception reaches us): the same then.
                self.source.invalidate()
                connection = getattr(pubsub, "connection", None)  # typed None in redis-py; set by subscribe
                if connection is not None:
                    connection.register_connect_callback(self._reconnected)
                backoff = 0.1
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None and message.get("data") == CHANGE_MESSAGE:
                        self.source.invalidate()
                        log.info("credentials.changed", store="redis")
            except Exception as e:  # never let the watcher die: a dead one would leave stale values
                if isinstance(e, RedisError | OSError):
                    REDIS_OUTAGE.failed("credentials.watch", e)
                level = log.warning if isinstance(e, RedisError | OSError) else log.exception
                level("credentials.watch_lost", error=type(e).__name__, retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2
