"""What a delivery thread needs of a transport, and how a send can end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sandgate.proxy.audit.sinks.events import Event

__all__ = ["Retry", "Sent", "Transport", "retry_after", "retryable_status"]

# HTTP answers worth another attempt: the receiver is busy, away or not (yet) letting us in
# (a token fixed while the queue waits loses nothing). Other 4xx refuse the batch for good.
RETRY_STATUSES = frozenset({401, 403, 404, 408, 409, 425, 429})


def retryable_status(status: int) -> bool:
    """Whether an HTTP status for a whole batch means: send it again later."""
    return status >= 500 or status in RETRY_STATUSES


class Retry(Exception):
    """The batch did not get through; send it again after a backoff (or `after` seconds).

    Its text names the receiver and what failed, never a credential.
    """

    def __init__(self, why: str, *, after: float | None = None) -> None:
        super().__init__(why)
        self.after = after


@dataclass(frozen=True, slots=True)
class Sent:
    """A batch the receiver answered: what to send again, and what it refused for good."""

    again: list[Event] = field(default_factory=list)  # refused for now (per-item 429, 503...)
    rejected: int = 0  # refused for good (a malformed event): counted as dropped, logged
    why: str = ""  # the receiver's reason for `again` or `rejected`


class Transport(Protocol):
    """Sends one batch and returns once the receiver acknowledged it; raises Retry otherwise."""

    @property
    def receiver(self) -> str:
        """The receiver as logs name it (no credentials)."""
        ...

    def send(self, events: list[Event]) -> Sent: ...

    def close(self) -> None: ...


def retry_after(answer: object) -> float | None:
    """An HTTP answer's Retry-After in seconds (delta form only), capped at five minutes."""
    headers = getattr(answer, "headers", None)
    value = headers.get("retry-after") if headers is not None else None
    try:
        return min(300.0, max(0.0, float(value))) if value else None
    except ValueError:
        return None
