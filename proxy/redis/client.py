"""One place that turns `redis:` config into a client: pooled, time-bounded, prefixed keys.

Every fleet module (registry, rate limits, audit stream, reload channel, credential store)
takes its client from here, so timeouts and the key prefix are the same everywhere. A call
that times out raises; callers fail closed (deny, keep cached state, spool audit).
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry as SyncRetry

from sandgate.proxy.config import RedisConfig
from sandgate.proxy.stores.placeholder_key import load_placeholder_key

__all__ = ["Keys", "connect", "connect_sync"]


def connect(cfg: RedisConfig) -> aioredis.Redis:
    """A pooled asyncio client; no I/O happens until the first command."""
    # A pooled connection that died with a restarted redis fails once; a fresh one is tried.
    retry = Retry(NoBackoff(), 1)
    return aioredis.Redis.from_url(cfg.url, retry=retry, **_settings(cfg))


def connect_sync(cfg: RedisConfig) -> redis.Redis:
    """A pooled synchronous client with the same settings, for threads (the audit writer, CLIs)."""
    return redis.Redis.from_url(cfg.url, retry=SyncRetry(NoBackoff(), 1), **_settings(cfg))


def _settings(cfg: RedisConfig) -> dict[str, Any]:
    password = None
    if cfg.password:
        password = load_placeholder_key(cfg.password, create=False, min_bytes=1).reveal()
    return {
        "password": password,
        "socket_timeout": cfg.timeout_seconds,
        "socket_connect_timeout": cfg.timeout_seconds,
        "max_connections": cfg.max_connections,
        "health_check_interval": 30,
        "retry_on_error": [RedisConnectionError],
        "decode_responses": False,
    }


class Keys:
    """Key names under the configured prefix (one redis can hold several fleets)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)
