"""Content decoding in a stream, so a compressed streamed response can be scrubbed.

A compressed body cannot be scrubbed as it is: the secret's bytes are not in it. A body whose
length is known and small is decoded whole by the caller; a streamed one (server-sent events
behind gzip, a large download) is decoded here chunk by chunk, scrubbed, and sent on as the
identity encoding, which every HTTP client accepts. Memory stays one piece of output at a
time: each chunk's output is cut into pieces of at most `PIECE` bytes, so a small chunk that
inflates to gigabytes is never held whole.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Iterator
from typing import Protocol

import brotli

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

__all__ = ["PIECE", "StreamDecoder", "UndecodableBody", "stream_decoder"]

# The most one decoder call hands out at once.
PIECE = 256 * 1024


class UndecodableBody(Exception):
    """The body is not valid in the encoding its header names."""


class StreamDecoder(Protocol):
    """Decodes one body: `feed` each chunk in order, then `finish` once."""

    def feed(self, chunk: bytes) -> Iterator[bytes]: ...

    def finish(self) -> Iterator[bytes]: ...


_INVALID = "the body is not valid in its content encoding"
_CUT = "the body ended before its compressed stream did"


class _ZlibDecoder:
    """gzip (several members, as `cat a.gz b.gz` makes), or deflate (zlib-wrapped, or raw as
    some servers send it)."""

    __slots__ = ("_head", "_inner", "_started", "_wbits")

    def __init__(self, wbits: int) -> None:
        self._wbits = wbits
        self._inner = zlib.decompressobj(wbits)
        self._started = False
        self._head = b""  # deflate: the first bytes, until they tell zlib from raw

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        try:
            if not self._started and self._wbits == zlib.MAX_WBITS:
                self._head += chunk
                if len(self._head) < 2:
                    return
                chunk, self._head = self._head, b""
                if not _zlib_header(chunk):
                    self._wbits = -zlib.MAX_WBITS  # raw deflate
                    self._inner = zlib.decompressobj(self._wbits)
            self._started = self._started or bool(chunk)
            yield from self._drain(chunk)
        except zlib.error as e:
            raise UndecodableBody(_INVALID) from e

    def _drain(self, data: bytes) -> Iterator[bytes]:
        while True:
            if self._inner.eof:
                if not data or self._wbits != 16 + zlib.MAX_WBITS:
                    return  # deflate has one stream; what may follow it is not content
                self._inner = zlib.decompressobj(self._wbits)  # the next gzip member
            out = self._inner.decompress(data, PIECE)
            if out:
                yield out
            data = self._inner.unused_data if self._inner.eof else self._inner.unconsumed_tail
            if not data and len(out) < PIECE:
                return  # a full piece may have more behind it: ask again with no input

    def finish(self) -> Iterator[bytes]:
        try:
            rest = self._inner.flush()
        except zlib.error as e:
            raise UndecodableBody(_INVALID) from e
        if rest:
            yield rest
        if (self._started or self._head) and not self._inner.eof:
            raise UndecodableBody(_CUT)


def _zlib_header(data: bytes) -> bool:
    """Whether `data` starts with a zlib header (RFC 1950), not raw deflate."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


class _BrotliDecoder:
    __slots__ = ("_inner", "_started")

    def __init__(self) -> None:
        self._inner = brotli.Decompressor()
        self._started = False

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        self._started = self._started or bool(chunk)
        try:
            out = self._inner.process(chunk, output_buffer_limit=PIECE)
            while True:
                if out:
                    yield out
                if self._inner.can_accept_more_data():
                    return
                out = self._inner.process(b"", output_buffer_limit=PIECE)
        except brotli.error as e:
            raise UndecodableBody(_INVALID) from e

    def finish(self) -> Iterator[bytes]:
        if self._started and not self._inner.is_finished():
            raise UndecodableBody(_CUT)
        return iter(())


class _ZstdDecoder:
    """zstd, several frames in a row as well."""

    __slots__ = ("_inner", "_started")

    def __init__(self) -> None:
        self._inner = zstd.ZstdDecompressor()
        self._started = False

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        self._started = self._started or bool(chunk)
        data = chunk
        try:
            while True:
                if self._inner.eof:
                    if not data:
                        return
                    self._inner = zstd.ZstdDecompressor()  # the next frame
                out = self._inner.decompress(data, max_length=PIECE)
                if out:
                    yield out
                if self._inner.eof:
                    data = self._inner.unused_data
                elif self._inner.needs_input:
                    return
                else:
                    data = b""  # more output is waiting behind a full piece
        except zstd.ZstdError as e:
            raise UndecodableBody(_INVALID) from e

    def finish(self) -> Iterator[bytes]:
        if self._started and not self._inner.eof:
            raise UndecodableBody(_CUT)
        return iter(())


def stream_decoder(content_encoding: str) -> StreamDecoder | None:
    """A decoder for one `Content-Encoding` value; None for one it cannot undo in a stream
    (several encodings stacked, `compress`, anything unknown): the same set mitmproxy decodes
    for a body read whole, so a body is scrubbable whether or not it streams."""
    name = content_encoding.strip().lower()
    if name == "gzip":
        return _ZlibDecoder(16 + zlib.MAX_WBITS)
    if name == "deflate":
        return _ZlibDecoder(zlib.MAX_WBITS)
    if name == "br":
        return _BrotliDecoder()
    if name == "zstd":
        return _ZstdDecoder()
    return None
