"""One place that turns `redis:` config into a client: pooled, time-bounded, prefixed keys.

Every fleet module (registry, rate limits, audit stream, reload channel, credential store)
takes its client from here, so timeouts and the key prefix are the same everywhere. A call
that times out raises; callers fail closed (deny, keep cached state, spool audit).
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from .config import RedisConfig
from .placeholder_key import load_placeholder_key

__all__ = ["Keys", "connect"]


def connect(cfg: RedisConfig) -> aioredis.Redis:
    """A pooled asyncio client; no I/O happens until the first command."""
    password = None
    if cfg.password:
        password = load_placeholder_key(cfg.password, create=False, min_bytes=1).reveal()
    return aioredis.Redis.from_url(
        cfg.url,
        password=password,
        socket_timeout=cfg.timeout_seconds,
        socket_connect_timeout=cfg.timeout_seconds,
        max_connections=cfg.max_connections,
        health_check_interval=30,
        # A pooled connection that died with a restarted redis fails once; a fresh one is tried.
        retry=Retry(NoBackoff(), 1),
        retry_on_error=[RedisConnectionError],
        decode_responses=False,
    )


class Keys:
    """Key names under the configured prefix (one redis can hold several fleets)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)
