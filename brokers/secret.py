"""`Secret`: a value that never shows itself in a repr, a log line, a format string or a pickle."""

from __future__ import annotations

import hmac
from typing import Any, NoReturn

__all__ = ["REDACTED", "Secret"]

REDACTED = "**********"


class Secret:
    """A secret value; `reveal()` and `reveal_bytes()` are the only ways to read it.

    It renders as `**********` everywhere (repr, str, any format spec), compares in constant
    time, refuses to be pickled, and is unhashable (a hash is a small oracle on the value).
    """

    __slots__ = ("__value",)

    def __init__(self, value: str | bytes) -> None:
        if isinstance(value, str):
            value = value.encode("utf-8", "surrogateescape")
        if not isinstance(value, bytes):
            raise TypeError("a Secret holds str or bytes")
        self.__value = value

    def reveal(self) -> str:
        """The value as text (UTF-8; undecodable bytes kept as surrogate escapes)."""
        return self.__value.decode("utf-8", "surrogateescape")

    def reveal_bytes(self) -> bytes:
        """The value as bytes."""
        return self.__value

    def __repr__(self) -> str:
        return f"Secret('{REDACTED}')"

    def __str__(self) -> str:
        return REDACTED

    def __format__(self, format_spec: str) -> str:
        return REDACTED

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self.__value, other.__value)

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return bool(self.__value)

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        raise TypeError("a Secret cannot be pickled")

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret cannot be pickled")

    def __getstate__(self) -> NoReturn:
        raise TypeError("a Secret cannot be pickled")

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Secret:
        return self
