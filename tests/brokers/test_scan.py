"""The placeholder scan finds every encoding a guest could use to smuggle one out."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandgate.brokers import PlaceholderMinter
from sandgate.brokers.scan import (
    STREAM_TAIL,
    Part,
    StreamScanner,
    Where,
    find_placeholders,
    scan_body,
    scan_request,
)

from .conftest import KEY, request

P = PlaceholderMinter(KEY).mint("t1", "sb1", "openai")
PB = P.encode()


def pct_all(text: str) -> str:
    return "".join(f"%{ord(c):02X}" for c in text)


ENCODINGS = {
    "raw": PB,
    "upper case": P.upper().encode(),
    "mixed case": "".join(c.upper() if i % 2 else c for i, c in enumerate(P)).encode(),
    "inside other text": b"my key is " + PB + b"!",
    "percent-encoded": pct_all(P).encode(),
    "percent-encoded lower-case hex": pct_all(P).lower().encode(),
    "partly percent-encoded": b"%73gph" + PB[4:],
    "double percent-encoded": pct_all(P).replace("%", "%25").encode(),
    "json unicode-escaped": json.dumps(P).replace("s", "\\u0073").encode(),
    "base64": base64.b64encode(PB),
    "base64 at offset 1": base64.b64encode(b"x" + PB),
    "base64 at offset 2": base64.b64encode(b"xy" + PB + b"."),
    "url-safe base64 of upper case": base64.urlsafe_b64encode(b"\xfb\xff" + P.upper().encode()),
    "base64 without padding": base64.b64encode(b"x" + PB).rstrip(b"="),
    "line-wrapped base64": base64.encodebytes(b"a" * 50 + PB + b"." * 50),
    "base64 of user:placeholder": b"Basic " + base64.b64encode(b"user:" + PB),
    "percent-encoded base64": quote(base64.b64encode(b"??>" + PB).decode(), safe="").encode(),
}


@pytest.mark.parametrize("data", ENCODINGS.values(), ids=[f"{k} is found" for k in ENCODINGS])
def test_every_encoding_is_found(data: bytes) -> None:
    assert find_placeholders(data) == {P}


@pytest.mark.parametrize(
    "data",
    [b"", b"sgph_", b"sgph_abc", b"sgph_abcdefg!", b"plain text " * 100, b"%%%zz\\u00"],
    ids=["empty", "the prefix alone", "a short tail", "seven characters", "plain text", "junk escapes"],
)
def test_nothing_is_found_where_there_is_none(data: bytes) -> None:
    assert find_placeholders(data) == set()


SHAPES = {
    "one character short": (PB[:-1], P[:-1]),
    "base64 of a truncated one": (base64.b64encode(PB[:-1]), P[:-1]),
    "one character too many": (PB + b"a", P + "a"),
    "the shortest shape": (b"x sgph_abcdefgh.", "sgph_abcdefgh"),
    "a truncated one, percent-encoded": (pct_all(P[:20]).encode(), P[:20]),
}


@pytest.mark.parametrize(
    ("data", "shape"), SHAPES.values(), ids=[f"{k} is one placeholder-shaped value" for k in SHAPES]
)
def test_a_placeholder_of_the_wrong_length_is_found_whole(data: bytes, shape: str) -> None:
    assert find_placeholders(data) == {shape}


def test_raw_occurrences_have_spans_and_encoded_ones_are_flagged() -> None:
    body = b'{"a": "' + PB + b'", "b": "' + P.upper().encode() + b'"}'
    scan = scan_body(body)
    assert [(s, e) for s, e, _ in scan.raw] == [
        (7, 7 + len(P)),
        (body.index(b"SGPH"), body.index(b"SGPH") + len(P)),
    ]
    assert scan.encoded == frozenset()
    assert scan_body(body + b" " + pct_all(P).encode()).encoded == {P}


def test_a_request_is_scanned_everywhere() -> None:
    req = request(
        host=f"{P}.evil.example",
        path=f"/x/{P}",
        query=f"key={P}&{P}=1&other=a%26key%3D{pct_all(P)}",
        headers=(
            ("X-Key", P),
            (P, "v"),
            ("Authorization", "Basic " + base64.b64encode(f"u:{P}".encode()).decode()),
        ),
        body=b'{"k": "' + PB + b'"}',
    )
    hits, body = scan_request(req)
    assert {str(h.where) for h in hits} == {
        "host",
        "header:host",
        "path",
        "query:key",
        "query",
        "query:other",
        "header:x-key",
        "header",
        "header:authorization",
        "body",
    }
    assert body is not None and body.raw


@given(st.binary(max_size=300), st.binary(max_size=300), st.integers(1, 64))
def test_the_stream_scanner_finds_a_placeholder_split_anywhere(
    before: bytes, after: bytes, size: int
) -> None:
    data = before + PB + b"." + after  # a letter right after would make it a longer, unknown value
    scanner = StreamScanner()
    found: set[str] = set()
    for i in range(0, len(data), size):
        found |= scanner.feed(data[i : i + size])
    assert P in found


@pytest.mark.parametrize("encoding", ["percent-encoded", "base64 at offset 1", "json unicode-escaped"])
def test_the_stream_scanner_finds_encodings_split_at_every_boundary(encoding: str) -> None:
    data = b"prefix " * 20 + ENCODINGS[encoding] + b" suffix" * 20
    for cut in range(1, len(data)):
        scanner = StreamScanner()
        assert scanner.feed(data[:cut]) | scanner.feed(data[cut:]) == {P}, cut


@pytest.mark.parametrize("encoding", ["raw", "percent-encoded", "base64 at offset 1", "json unicode-escaped"])
def test_a_truncated_placeholder_at_a_chunk_boundary_waits_for_the_next_chunk(encoding: str) -> None:
    data = b"prefix " * 20 + ENCODINGS[encoding]
    cut = len(data) - 3
    scanner = StreamScanner()
    assert scanner.feed(data[:cut]) == set(), "a value the next chunk completes is not reported cut"
    assert scanner.feed(data[cut:]) == {P}
    assert scanner.feed(b"") == set()


def test_a_truncated_placeholder_at_the_end_of_a_stream_is_reported_at_the_end() -> None:
    scanner = StreamScanner()
    assert scanner.feed(b"text " + PB[:20]) == set()
    assert scanner.feed(b"") == {P[:20]}


def test_the_stream_scanner_keeps_a_bounded_tail() -> None:
    scanner = StreamScanner()
    for _ in range(100):
        scanner.feed(b"x" * 65536)
    assert len(scanner._tail) == STREAM_TAIL


def test_where_renders_as_audited() -> None:
    assert str(Where(Part.HEADER, "authorization")) == "header:authorization"
    assert str(Where(Part.BODY)) == "body"
