"""A cache for short-lived tokens: reuse until shortly before expiry, one fetch at a time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sandgate.brokers.errors import TokenEndpointError
from sandgate.brokers.secret import Secret

__all__ = ["Token", "TokenCache", "parse_json_object", "refresh_time"]


@dataclass(frozen=True, slots=True)
class Token:
    """A minted token, when it expires and when to refresh it (wall-clock seconds)."""

    value: Secret
    expires_at: float
    refresh_at: float


def refresh_time(issued_at: float, expires_at: float, skew: float) -> float:
    """`skew` seconds before expiry, but never earlier than halfway through a short lifetime."""
    lifetime = max(0.0, expires_at - issued_at)
    return issued_at + max(lifetime - skew, lifetime / 2)


def parse_json_object(body: bytes, what: str) -> dict[str, Any]:
    """A JSON object from a token endpoint, or TokenEndpointError (never quoting the body)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise TokenEndpointError(f"{what} answered something that is not JSON") from None
    if not isinstance(data, dict):
        raise TokenEndpointError(f"{what} answered JSON that is not an object")
    return data


class TokenCache:
    """Holds one token; `get` returns it until its refresh time, then fetches a new one.

    Concurrent callers share one fetch. A failed fetch is remembered for `failure_backoff`
    seconds so an endpoint that is down is not hammered by every request.
    """

    __slots__ = ("_backoff", "_clock", "_failed_at", "_fetch", "_lock", "_token")

    def __init__(
        self,
        fetch: Callable[[], Awaitable[Token]],
        clock: Callable[[], float],
        *,
        failure_backoff: float = 1.0,
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self._backoff = failure_backoff
        self._token: Token | None = None
        self._failed_at: tuple[float, TokenEndpointError] | None = None
        self._lock = asyncio.Lock()

    @property
    def current(self) -> Token | None:
        """The cached token, fresh or not."""
        return self._token

    def _fresh(self) -> Token | None:
        token = self._token
        if token is not None and self._clock() < token.refresh_at:
            return token
        return None

    async def get(self) -> Token:
        """A token valid for at least the skew; fetched when the cached one is due."""
        token = self._fresh()
        if token is not None:
            return token
        async with self._lock:
            token = self._fresh()
            if token is not None:
                return token
            if self._failed_at is not None and self._clock() < self._failed_at[0] + self._backoff:
                raise TokenEndpointError(str(self._failed_at[1]))
            try:
                token = await self._fetch()
            except TokenEndpointError as e:
                self._failed_at = (self._clock(), e)
                raise
            self._failed_at = None
            self._token = token
            return token

    def invalidate(self) -> None:
        """Forget the cached token (the upstream rejected it)."""
        self._token = None
