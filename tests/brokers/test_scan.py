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
    "base64 at offset 2": base64.b64encode(b"xy" + PB + b"z"),
    "url-safe base64 of upper case": base64.urlsafe_b64encode(b"\xfb\xff" + P.upper().encode()),
    "base64 without padding": base64.b64encode(b"x" + PB).rstrip(b"="),
    "line-wrapped base64": base64.encodebytes(b"a" * 50 + PB + b"b" * 50),
    "base64 of user:placeholder": b"Basic " + base64.b64encode(b"user:" + PB),
    "percent-encoded base64": quote(base64.b64encode(b"??>" + PB).decode(), safe="").encode(),
}


@pytest.mark.parametrize("data", ENCODINGS.values(), ids=[f"{k} is found" for k in ENCODINGS])
def test_every_encoding_is_found(data: bytes) -> None:
    assert find_placeholders(data) == {P}


@pytest.mark.parametrize(
    "data",
    [b"", b"sgph_", b"sgph_abc", PB[:-1], b"plain text " * 100, base64.b64encode(PB[:-1]), b"%%%zz\\u00"],
    ids=[
        "empty",
        "the prefix alone",
        "a short tail",
        "one character short",
        "plain text",
        "base64 of a truncated one",
        "junk escapes",
    ],
)
def test_nothing_is_found_where_there_is_none(data: bytes) -> None:
    assert find_placeholders(data) == set()


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
    data = before + PB + after
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


def test_the_stream_scanner_keeps_a_bounded_tail() -> None:
    scanner = StreamScanner()
    for _ in range(100):
        scanner.feed(b"x" * 65536)
    assert len(scanner._tail) == STREAM_TAIL


def test_where_renders_as_audited() -> None:
    assert str(Where(Part.HEADER, "authorization")) == "header:authorization"
    assert str(Where(Part.BODY)) == "body"
