"""Whether the fleet's redis is reachable, as this process last found it: one object that every
user of the `redis:` server reports to, so one place knows that redis is down and since when.

Each user still fails closed on its own terms when a call fails (the registry keeps its
snapshot until it is too old, the limiter counts locally, audit records spool to disk, the
grants keep their last snapshot for a while, an admin change answers 503); this object only
records it (`failed`, `reached`, or `track` around a call). The transitions are logged once
each (`redis.down`, `redis.up`), not per call.
The admin API's /readyz reports its own ping here too.

Thread-safe: the audit stream's writer reports from its own thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog
from redis.exceptions import RedisError

__all__ = ["REDIS_OUTAGE", "RedisOutage"]

log = structlog.get_logger("sandgate.redis")


class RedisOutage:
    """Redis as this process last found it: up (or not tried yet), or down since a time."""

    def __init__(self, server: str) -> None:
        # Which redis, in the log lines: `fleet` (the `redis:` server) or `limit_relay`.
        self.server = server
        self._lock = threading.Lock()
        self._since: float | None = None  # wall clock, for people
        self._since_monotonic: float | None = None
        self.outages = 0

    @property
    def down(self) -> bool:
        """Whether the last call any user reported failed."""
        return self._since is not None

    @property
    def since(self) -> float | None:
        """When redis was first found down in this outage (epoch seconds); None while it is up."""
        return self._since

    def down_for(self) -> float | None:
        """Seconds since redis was found down; None while it is up."""
        started = self._since_monotonic
        return None if started is None else time.monotonic() - started

    def failed(self, user: str, error: BaseException | str, **context: Any) -> bool:
        """A call of `user` did not reach redis; True when this began an outage (then logged,
        with `context`)."""
        with self._lock:
            if self._since is not None:
                return False
            self._since, self._since_monotonic = time.time(), time.monotonic()
            self.outages += 1
        reason = error if isinstance(error, str) else type(error).__name__
        log.error("redis.down", server=self.server, user=user, error=reason, **context)
        return True

    def reached(self, user: str) -> bool:
        """A call of `user` reached redis; True when this ended an outage (then logged)."""
        with self._lock:
            started = self._since_monotonic
            if started is None:
                return False
            self._since = self._since_monotonic = None
        log.warning(
            "redis.up", server=self.server, user=user, seconds_down=round(time.monotonic() - started, 1)
        )
        return True

    @contextmanager
    def track(self, user: str) -> Iterator[None]:
        """Report the redis calls in the block: a RedisError or OSError out of it (re-raised) is
        a failure, leaving it otherwise is a call that reached redis."""
        try:
            yield
        except (RedisError, OSError) as e:
            self.failed(user, e)
            raise
        self.reached(user)


# This process's view of the `redis:` server (the workers' limit relay is another server).
REDIS_OUTAGE = RedisOutage("fleet")
