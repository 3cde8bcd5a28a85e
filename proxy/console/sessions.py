"""Console logins: the admin token (compared in constant time) exchanged for a random session
id kept in memory with a TTL, a CSRF token per session, and failed logins limited per address.

A session id and its CSRF token are 256 random bits each; neither is ever logged. Sessions end
at their TTL, at logout, or when the gateway restarts (nothing is written to disk)."""

from __future__ import annotations

import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sandgate.brokers import Secret

__all__ = ["LoginLimiter", "Session", "SessionBook", "csrf_matches"]

# Sessions kept at most: beyond it the oldest goes (a flood of logins cannot grow memory).
MAX_SESSIONS = 1000
# Addresses the limiter remembers at most.
MAX_ADDRESSES = 10_000


@dataclass(frozen=True, slots=True)
class Session:
    """One logged-in browser."""

    id: str
    csrf: str
    expires: float


class SessionBook:
    """The console's sessions, in memory."""

    def __init__(self, token: Secret, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._token = token
        self._ttl = ttl
        self._clock = clock
        self._sessions: dict[str, Session] = {}

    def token_matches(self, offered: str) -> bool:
        """Whether `offered` is the admin token (constant time)."""
        return hmac.compare_digest(offered.encode(), self._token.reveal().encode())

    def open(self) -> Session:
        """A new session (the caller checked the token)."""
        self._sweep()
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.pop(next(iter(self._sessions)))
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), self._clock() + self._ttl)
        self._sessions[session.id] = session
        return session

    def find(self, session_id: str | None) -> Session | None:
        """The live session with this id, or None."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if session.expires <= self._clock():
            del self._sessions[session_id]
            return None
        return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)

    def _sweep(self) -> None:
        now = self._clock()
        for sid in [sid for sid, s in self._sessions.items() if s.expires <= now]:
            del self._sessions[sid]


def csrf_matches(session: Session, offered: str | None) -> bool:
    """Whether a form's or header's CSRF token is the session's (constant time)."""
    return offered is not None and hmac.compare_digest(offered.encode(), session.csrf.encode())


class LoginLimiter:
    """At most `per_minute` failed logins per client address in any sliding minute."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._per_minute = per_minute
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}

    def allowed(self, address: str) -> bool:
        """Whether this address may try a login now."""
        window = self._window(address)
        return window is None or len(window) < self._per_minute

    def failed(self, address: str) -> None:
        if address not in self._failures and len(self._failures) >= MAX_ADDRESSES:
            self._failures.pop(next(iter(self._failures)))
        self._failures.setdefault(address, deque()).append(self._clock())

    def _window(self, address: str) -> deque[float] | None:
        window = self._failures.get(address)
        if window is None:
            return None
        cutoff = self._clock() - 60
        while window and window[0] <= cutoff:
            window.popleft()
        if not window:
            del self._failures[address]
            return None
        return window
