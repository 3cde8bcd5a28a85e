"""Tests for sandgate.policy.percent: `%XX` escapes read the same way for hosts and paths."""

from __future__ import annotations

from urllib.parse import quote_from_bytes, unquote_to_bytes

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy.errors import HostError
from sandgate.policy.percent import read_escapes

BAD = HostError("bad escape")

READ = [
    (b"", [], "nothing reads as nothing"),
    (b"ab", [(0x61, False), (0x62, False)], "raw bytes are raw"),
    (b"%41", [(0x41, True)], "an escape is decoded and marked"),
    (b"%2f%2F", [(0x2F, True), (0x2F, True)], "hex digits in either case"),
    (b"%aB%Ab", [(0xAB, True), (0xAB, True)], "hex digits in mixed case"),
    (b"\xff%ff", [(0xFF, False), (0xFF, True)], "a raw high byte and an escaped one"),
    (b"a%00b", [(0x61, False), (0x00, True), (0x62, False)], "an encoded nul is a value like any other"),
    (b"%2541", [(0x25, True), (0x34, False), (0x31, False)], "one decode only"),
]


@pytest.mark.parametrize(("data", "expected", "why"), READ, ids=[r[2] for r in READ])
def test_read_escapes(data: bytes, expected: list[tuple[int, bool]], why: str) -> None:
    assert list(read_escapes(data, BAD)) == expected


INVALID = [
    (b"%", "a lone percent sign"),
    (b"%4", "a truncated escape"),
    (b"%zz", "non-hex digits"),
    (b"%+f", "a sign is not a hex digit"),
    (b"% f", "a space is not a hex digit"),
    (b"ok%g0", "an invalid escape after good bytes"),
]


@pytest.mark.parametrize(("data", "why"), INVALID, ids=[r[1] for r in INVALID])
def test_an_invalid_escape_raises_the_callers_error(data: bytes, why: str) -> None:
    with pytest.raises(HostError) as raised:
        list(read_escapes(data, BAD))
    assert raised.value is BAD


def test_bytes_before_an_invalid_escape_are_read_first() -> None:
    """A caller checking each byte as it comes sees the earlier ones before the error."""
    values = read_escapes(b"ab%zz", BAD)
    assert next(values) == (0x61, False)
    assert next(values) == (0x62, False)
    with pytest.raises(HostError):
        next(values)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64))
def test_encoding_then_reading_gives_back_the_bytes(data: bytes) -> None:
    encoded = quote_from_bytes(data, safe="").encode()
    assert bytes(v for v, _ in read_escapes(encoded, BAD)) == data


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="%0123456789abcdefABCDEFxyz/", max_size=24))
def test_agrees_with_the_standard_library_where_escapes_are_valid(text: str) -> None:
    data = text.encode()
    try:
        values = list(read_escapes(data, BAD))
    except HostError:
        return
    assert bytes(v for v, _ in values) == unquote_to_bytes(text)
