"""Content decoding in a stream: any chunking gives the body back, a cut or corrupt one is refused."""

from __future__ import annotations

import gzip
import sys
import zlib

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.brokers.decoding import PIECE, UndecodableBody, stream_decoder

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


ENCODERS = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "raw deflate": _raw_deflate,
    "br": brotli.compress,
    "zstd": zstd.compress,
}
HEADER = {"gzip": "gzip", "deflate": "deflate", "raw deflate": "deflate", "br": "br", "zstd": "zstd"}


def decode_in_chunks(name: str, encoded: bytes, sizes: list[int]) -> bytes:
    decoder = stream_decoder(HEADER[name])
    assert decoder is not None
    out, pos, i = [], 0, 0
    while pos < len(encoded):
        size = sizes[i % len(sizes)]
        out += list(decoder.feed(encoded[pos : pos + size]))
        pos, i = pos + size, i + 1
    out += list(decoder.finish())
    assert b"" not in out, "no empty piece is handed out"
    return b"".join(out)


@settings(max_examples=150)
@given(
    name=st.sampled_from(sorted(ENCODERS)),
    body=st.binary(max_size=3000) | st.just(b"data: tok\n\n" * 400),
    sizes=st.lists(st.integers(1, 700), min_size=1, max_size=8),
)
def test_any_chunking_of_an_encoded_body_decodes_to_the_body(
    name: str, body: bytes, sizes: list[int]
) -> None:
    assert decode_in_chunks(name, ENCODERS[name](body), sizes) == body


@pytest.mark.parametrize(
    ("name", "encoded", "body"),
    [
        ("gzip", gzip.compress(b"first ") + gzip.compress(b"second"), b"first second"),
        ("zstd", zstd.compress(b"first ") + zstd.compress(b"second"), b"first second"),
    ],
    ids=["gzip members one after another", "zstd frames one after another"],
)
def test_concatenated_streams_decode_whole(name: str, encoded: bytes, body: bytes) -> None:
    for size in (1, 3, len(encoded)):
        assert decode_in_chunks(name, encoded, [size]) == body


@pytest.mark.parametrize(
    "name", sorted(ENCODERS), ids=[f"a cut {n} stream is refused" for n in sorted(ENCODERS)]
)
def test_a_cut_stream_is_refused_at_its_end(name: str) -> None:
    encoded = ENCODERS[name](bytes(range(256)) * 40)
    with pytest.raises(UndecodableBody):
        decode_in_chunks(name, encoded[: len(encoded) // 2], [7])


@pytest.mark.parametrize("name", ["gzip", "br", "zstd"], ids=lambda n: f"corrupt {n} is refused")
def test_corrupt_bytes_are_refused(name: str) -> None:
    with pytest.raises(UndecodableBody):
        decode_in_chunks(
            name, b"\x1f\x8b\x08\x00garbage-garbage-garbage" if name == "gzip" else b"garbage" * 9, [4]
        )


def test_a_small_chunk_that_inflates_hugely_is_handed_out_in_bounded_pieces() -> None:
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024))
    decoder = stream_decoder("gzip")
    assert decoder is not None
    total = 0
    for piece in decoder.feed(bomb):
        assert len(piece) <= PIECE
        total += len(piece)
    assert total == 64 * 1024 * 1024


@pytest.mark.parametrize("header", ["gzip, gzip", "compress", "x-gzip", "identity2", ""])
def test_encodings_it_cannot_undo_in_a_stream_have_no_decoder(header: str) -> None:
    assert stream_decoder(header) is None
