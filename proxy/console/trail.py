"""Which trail the console reads: the fleet audit stream in redis when the gateway has
`redis:` (every gateway's records, so any gateway of a fleet answers for the whole fleet), else
this gateway's audit file. The readers are `sandgate audit`'s own (`JsonlSource`,
`StreamSource`); each use opens a fresh one, since a reader keeps its place in the trail."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import redis

from sandgate.proxy.audit.files import JsonlSource, Source
from sandgate.proxy.audit.query import AuditInputError
from sandgate.proxy.audit.stream_source import BLOCK_MS, StreamSource
from sandgate.proxy.config import GatewayConfig, RedisConfig
from sandgate.proxy.redis.client import Keys, connect_sync

__all__ = ["Trail", "file_trail", "gateway_trail", "stream_trail"]

# How often a file reader looks for new lines (as `sandgate audit tail --follow` does).
POLL_SECONDS = 0.2
# Newest stream entries the health page reads to name the fleet's gateways.
MEMBERS_WINDOW = 2000


@dataclass(frozen=True, slots=True)
class Trail:
    """Opens a reader of one trail; `fleet` when it holds every gateway's records."""

    open: Callable[[], Source]
    fleet: bool
    # Where it is, for people (a path, or a redis host:port and key: never a password).
    where: str
    # Releases what the readers share (the redis connection pool), when the gateway stops.
    close: Callable[[], None] = lambda: None
    # The fleet's gateways seen in the newest records (blocking); None without a fleet stream.
    members: Callable[[], list[dict[str, Any]]] | None = None


def file_trail(path: Path) -> Trail:
    """This gateway's audit file (and its rotated predecessors)."""
    return Trail(lambda: JsonlSource(path, poll_seconds=POLL_SECONDS), fleet=False, where=str(path))


def stream_trail(cfg: RedisConfig) -> Trail:
    """The fleet audit stream `<prefix>audit` of the redis `cfg` names."""
    # A reader blocks in XREAD for BLOCK_MS: its socket must wait longer than that.
    timeout = min(max(cfg.timeout_seconds, 5.0) + BLOCK_MS / 1000, 30.0)
    reading = cfg.model_copy(update={"timeout_seconds": timeout})
    # One connection pool for every reader (the client is thread-safe; readers are threads).
    client = connect_sync(reading)
    key = Keys(cfg.prefix)("audit")
    parts = urlsplit(cfg.url)
    server = parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port or 6379}"
    return Trail(
        lambda: StreamSource(client, key, where=server),
        fleet=True,
        where=f"{server} {key}",
        close=client.close,
        members=lambda: stream_members(client, key, server),
    )


def stream_members(client: redis.Redis, key: str, server: str) -> list[dict[str, Any]]:
    """The gateways that wrote the newest `MEMBERS_WINDOW` entries of the stream (each entry's
    `gw`, as redis_stream writes it): name, records among them, time of the newest."""
    try:
        # (entry id, fields) pairs, bytes: the client does not decode responses.
        page: list[tuple[bytes, dict[bytes, bytes]]] = cast(
            Any, client.xrevrange(key, "+", "-", count=MEMBERS_WINDOW)
        )
    except redis.RedisError as e:
        raise AuditInputError(f"the audit stream at {server}: {type(e).__name__}") from None
    counts: Counter[str] = Counter()
    newest: dict[str, int] = {}
    for entry_id, fields in page:
        name = fields.get(b"gw", b"?").decode(errors="replace")
        counts[name] += 1
        newest.setdefault(name, int(entry_id.split(b"-")[0]))
    return [
        {
            "gateway": name,
            "records": counts[name],
            "last_record": datetime.fromtimestamp(newest[name] / 1000, UTC).isoformat(timespec="seconds"),
        }
        for name in sorted(counts)
    ]


def gateway_trail(config: GatewayConfig) -> Trail:
    """The trail the console of this gateway reads."""
    return stream_trail(config.redis) if config.redis is not None else file_trail(config.audit_path)
