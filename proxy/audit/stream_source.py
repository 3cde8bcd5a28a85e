"""The fleet audit stream as a `Source`: every gateway's records, read from redis in pages.

Entries are `{id, gw, r}` with `r` the record's JSON line, as `redis_stream` writes them.
`records` pages through XRANGE and `latest` through XREVRANGE (bounded memory either way);
`follow` waits with XREAD BLOCK. Entries are in the order redis received them: a spool
replayed after an outage lands after newer records of other gateways. A record trimmed by
`MAXLEN` before `follow` read it counts as a gap; an entry without a JSON object is malformed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any

import redis

from sandgate.proxy.audit.files import decode
from sandgate.proxy.audit.query import AuditInputError, Query, Record, line_filter

__all__ = ["StreamSource"]

PAGE = 1000
BLOCK_MS = 500

Entry = tuple[bytes, dict[bytes, bytes]]


class StreamSource:
    """The audit stream `key` in the redis `client` points at (`where` names it in errors)."""

    def __init__(self, client: redis.Redis, key: str, *, where: str) -> None:
        self.malformed = 0
        self.gaps = 0
        self._client = client
        self._key = key
        self._where = where
        self._resume: bytes | None = None

    def records(self, query: Query) -> Generator[Record, None, None]:
        """Every selected record, oldest first, one page at a time."""
        may_match, start = line_filter(query), b"-"
        while True:
            page: list[Entry] = self._call(self._client.xrange, self._key, start, "+", count=PAGE)
            yield from self._select(page, query, may_match)
            if len(page) < PAGE:
                return
            start = b"(" + page[-1][0]

    def latest(self, query: Query, n: int) -> list[Record]:
        """The newest `n` selected records, oldest first; `follow` continues after the newest entry."""
        may_match, end = line_filter(query), b"+"
        found: list[Record] = []
        self._resume = b"0-0"
        while True:
            page: list[Entry] = self._call(self._client.xrevrange, self._key, end, "-", count=PAGE)
            if end == b"+" and page:
                self._resume = page[0][0]
            for record in self._select(page, query, may_match):
                if len(found) == n:
                    break
                found.append(record)
            if len(found) >= n or len(page) < PAGE:
                return found[::-1]
            end = b"(" + page[-1][0]

    def follow(self, query: Query, stop: threading.Event) -> Generator[Record, None, None]:
        """Records added after `latest` (or from now), until `stop` is set."""
        may_match = line_filter(query)
        last = self._resume if self._resume is not None else self._newest_id()
        while not stop.is_set():
            reply = self._call(self._client.xread, {self._key: last}, count=PAGE, block=BLOCK_MS)
            for _key, page in reply or []:
                if self._trimmed_after(last):
                    self.gaps += 1
                yield from self._select(page, query, may_match)
                last = page[-1][0]

    def _newest_id(self) -> bytes:
        """The id of the newest entry, or 0-0 for an empty stream."""
        page: list[Entry] = self._call(self._client.xrevrange, self._key, "+", "-", count=1)
        return page[0][0] if page else b"0-0"

    def _trimmed_after(self, last: bytes) -> bool:
        """Whether MAXLEN trimmed entries newer than `last` (they were never read)."""
        info: dict[Any, Any] = self._call(self._client.xinfo_stream, self._key)
        deleted = info.get("max-deleted-entry-id") or info.get(b"max-deleted-entry-id")
        return deleted is not None and _id(deleted) > _id(last)

    def _select(
        self, page: list[Entry], query: Query, may_match: Callable[[bytes], bool]
    ) -> Iterator[Record]:
        for _entry_id, fields in page:
            line = fields.get(b"r")
            if line is None:
                self.malformed += 1
                continue
            if not may_match(line):
                continue
            record = decode(line)
            if record is None:
                self.malformed += 1
            elif query.matches(record):
                yield record

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A redis call; a failure becomes an input error naming the server (never its password)."""
        try:
            return method(*args, **kwargs)
        except redis.RedisError as e:
            raise AuditInputError(
                f"cannot read the audit stream {self._key!r} at {self._where}: {e}"
            ) from None


def _id(entry_id: bytes | str) -> tuple[int, int]:
    """A stream entry id as comparable numbers."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)
