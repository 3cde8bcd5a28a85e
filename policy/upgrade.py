"""What protocol switch an HTTP/1.1 request asks for (its `Upgrade` header), normalised."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["WEBSOCKET", "requested_upgrade"]

WEBSOCKET = "websocket"


def requested_upgrade(headers: Iterable[tuple[str, str]]) -> str | None:
    """The `Upgrade` protocols, lower case, comma-joined (`websocket`, `h2c, foo`); None without one.

    Several `Upgrade` lines count as one list (RFC 9110 5.3); an empty value is still a request.
    """
    values = [value for name, value in headers if name.lower() == "upgrade"]
    if not values:
        return None
    tokens = [t.strip().lower() for value in values for t in value.split(",")]
    return ", ".join(t for t in tokens if t) or "?"
