"""Percent-escapes (`%XX`) read one way for hosts and paths alike."""

from __future__ import annotations

from collections.abc import Iterator

from sandgate.policy.errors import HostError

__all__ = ["read_escapes"]

_HEX_DIGITS = "0123456789abcdefABCDEF"
# Every valid escape's two digits (either case, "aB" too) to its value: one lookup instead of
# a check and a parse per escape.
_ESCAPES = {(a + b).encode(): int(a + b, 16) for a in _HEX_DIGITS for b in _HEX_DIGITS}
# The pairs this yields, made once (a byte is read on the request path).
_RAW = tuple((v, False) for v in range(256))
_ESCAPED = tuple((v, True) for v in range(256))


def read_escapes(data: bytes, invalid: HostError) -> Iterator[tuple[int, bool]]:
    """Each byte of `data` with `%XX` escapes decoded, as (value, escaped); raises `invalid`
    (worded by the caller) at a '%' not followed by two hex digits."""
    # A generator, so a caller's own check on an earlier byte still fails first.
    i, end = 0, len(data)
    while i < end:
        byte = data[i]
        if byte != 0x25:  # '%'
            yield _RAW[byte]
            i += 1
            continue
        value = _ESCAPES.get(data[i + 1 : i + 3])
        if value is None:
            raise invalid
        yield _ESCAPED[value]
        i += 3
