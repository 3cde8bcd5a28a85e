"""File descriptors: raise the soft limit at start, and know cheaply how close the process is to it.

A flood of idle connections used to take every descriptor: accept failed (and logged) in a
loop, and connections already admitted could no longer dial upstream, write the audit or reach
redis. The gateway now keeps headroom: new guest connections are refused before the limit.
Counting `/proc/self/fd` costs a syscall per descriptor, so it is sampled, and in between the
estimate moves with the connections mitmproxy opens and closes (which the hooks report).
"""

from __future__ import annotations

import os
import resource
import time

import structlog

__all__ = ["FdBudget", "count_open_fds", "raise_fd_limit"]

log = structlog.get_logger("sandgate.fdbudget")

# Descriptors kept free above the hard mark whatever the percentage (see set_limit).
MIN_ACCEPT_MARGIN = 256
# Past the soft mark the estimate is re-sampled at most this often (else once a sweep tick).
_CLOSE_RESAMPLE_SECONDS = 0.05


def raise_fd_limit() -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit to the hard one; returns (soft, hard) in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:
            log.warning("fd_limit.raise_failed", soft=soft, hard=hard, error=str(e))
    return soft, hard


def count_open_fds() -> int:
    """The descriptors this process holds now (Linux: /proc/self/fd)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor
    except OSError:
        return 0


class FdBudget:
    """Estimates this process's open descriptors between samples; says when new guest
    connections need room made for them (connection limits close an idle one) or must wait.

    `tracked` is what the hooks count (client plus upstream connections); the rest of the process
    (listeners, audit file, redis pool, admin socket, ...) is `other`, re-measured by `sample`.
    The limit and the marks are this process's: each of a gateway's workers has its own.
    """

    def __init__(self, headroom_percent: float, limit: int | None = None) -> None:
        self.headroom_percent = headroom_percent
        self.tracked = 0
        self._other = 0
        self._sampled_at = 0.0
        self.set_limit(limit if limit is not None else resource.getrlimit(resource.RLIMIT_NOFILE)[0])

    def set_limit(self, limit: int) -> None:
        """Past `soft` only light sources are admitted; past `hard` no new guest connection is."""
        if limit == resource.RLIM_INFINITY or limit <= 0:
            limit = 1 << 20
        self.limit = limit
        # asyncio accepts up to 100 connections per wake-up, and a refused one holds its
        # descriptor for a loop turn or two: the hard mark stays that far below the limit.
        headroom = max(int(limit * self.headroom_percent / 100), 2 * MIN_ACCEPT_MARGIN)
        self.soft = max(0, limit - headroom)
        self.hard = max(0, limit - max(headroom // 2, MIN_ACCEPT_MARGIN))

    def sample(self) -> int:
        """Count the process's descriptors now; returns the count."""
        total = count_open_fds()
        self._other = max(0, total - self.tracked)
        self._sampled_at = time.monotonic()
        return total

    @property
    def estimate(self) -> int:
        return self._other + self.tracked

    def fresh_estimate(self) -> int:
        """The estimate, re-sampled first when it is past the soft mark and the sample is old:
        what the marks decide on is then a count at most 50 ms old plus the hooks' changes."""
        estimate = self.estimate
        if estimate >= self.soft and time.monotonic() - self._sampled_at > _CLOSE_RESAMPLE_SECONDS:
            return self.sample()
        return estimate
