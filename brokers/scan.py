"""Find placeholders anywhere in a request: raw, any case, percent-encoded, JSON-escaped, base64.

What is found is anything placeholder-shaped (`PLACEHOLDER_PATTERN`: the prefix and at least
`MIN_SHAPE_CHARS` alphabet characters), genuine or not: the planner refuses every one that
is not a placeholder of the requesting sandbox.

This is the exfiltration tripwire. The guarantee that a secret only reaches its bound hosts
comes from injecting only there; the scan makes sure no placeholder (of this sandbox or any
other) is forwarded elsewhere, in any of the encodings an upstream would decode:

- raw, after lower-casing (the placeholder alphabet has no case);
- percent-decoded, repeatedly (double encoding);
- JSON `\\uXXXX` and `\\/` escapes decoded;
- base64 (standard or URL-safe, line-wrapped or not) decoded at each of the four alignments,
  for every run of base64 characters long enough to hold a placeholder, once a cheap
  Aho-Corasick prefilter over the encodings of `sgph_` in every case says one may be there.

Not decoded: compressed bodies, hex, quoted-printable, HTML entities, nested base64.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import unquote_to_bytes

import ahocorasick_rs

from sandgate.brokers.placeholders import (
    MIN_SHAPE_CHARS,
    PLACEHOLDER_LENGTH,
    PLACEHOLDER_PATTERN,
    PLACEHOLDER_PREFIX,
)
from sandgate.brokers.request import BrokerRequest

__all__ = [
    "BodyScan",
    "Hit",
    "Part",
    "StreamScanner",
    "Where",
    "find_placeholders",
    "scan_body",
    "scan_request",
]

_PERCENT_ROUNDS = 3
# Long enough to hold any encoding decoded here: \\u-escaped is 6 bytes per character.
STREAM_TAIL = 8 * PLACEHOLDER_LENGTH

# How far from the end of a decoded chunk a cut value may end (a cut escape stays literal: `\\u007`).
_SLACK = 6
_JSON_ESCAPE = re.compile(rb"\\(?:[uU]([0-9a-fA-F]{4})|/)")
_URLSAFE_TO_STD = bytes.maketrans(b"-_", b"+/")


def _b64_core(data: bytes, align: int) -> bytes:
    """The base64 characters that depend only on `data` when it starts `align` bytes into a group."""
    encoded = base64.b64encode(b"\0" * align + data + b"\0\0")
    return encoded[-(-8 * align // 6) : (8 * align + 8 * len(data)) // 6]


def _min_b64_run() -> int:
    """The fewest contiguous base64 characters that can carry the shortest placeholder shape."""
    shortest = len(PLACEHOLDER_PREFIX) + MIN_SHAPE_CHARS
    return min(len(_b64_core(b"x" * shortest, a)) for a in range(3))


def _prefix_cores() -> list[bytes]:
    """Base64 cores of `sgph_` in every letter case, at every alignment, standard and URL-safe."""
    prefix = PLACEHOLDER_PREFIX
    variants = {
        "".join(chars).encode()
        for chars in itertools.product(*[(c.lower(), c.upper()) if c.isalpha() else (c,) for c in prefix])
    }
    cores: set[bytes] = set()
    for variant in variants:
        for align in range(3):
            core = _b64_core(variant, align)
            cores.add(core)
            cores.add(core.replace(b"+", b"-").replace(b"/", b"_"))
    return sorted(cores)


_MIN_RUN = _min_b64_run()
_B64_RUN = re.compile(rb"[A-Za-z0-9+/_-]{%d,}" % _MIN_RUN)
_B64_PREFILTER = ahocorasick_rs.BytesAhoCorasick(
    _prefix_cores(), implementation=ahocorasick_rs.Implementation.DFA
)


class Part(StrEnum):
    """Where in a request a placeholder was seen."""

    HOST = "host"
    PATH = "path"
    QUERY = "query"
    HEADER = "header"
    BODY = "body"


@dataclass(frozen=True, slots=True)
class Where:
    """A place in a request: a part, and the header or query parameter name when it has one.

    For the body, `name` is '' for a raw occurrence and 'encoded' for one only an upstream
    decoding (percent, JSON escape, base64) would see.
    """

    part: Part
    name: str = ""

    def __str__(self) -> str:
        return f"{self.part}:{self.name}" if self.name else str(self.part)


@dataclass(frozen=True, slots=True)
class Hit:
    """One placeholder (lower case) seen at one place."""

    placeholder: str
    where: Where


@dataclass(frozen=True, slots=True)
class BodyScan:
    """Placeholders in a body: raw occurrences with their byte spans, and those seen only encoded."""

    raw: tuple[tuple[int, int, str], ...]
    encoded: frozenset[str]

    @property
    def placeholders(self) -> frozenset[str]:
        return frozenset(p for _, _, p in self.raw) | self.encoded


def _json_unescape(data: bytes) -> bytes:
    def one(m: re.Match[bytes]) -> bytes:
        if m.group(1) is None:
            return b"/"
        code = int(m.group(1), 16)
        if 0xD800 <= code <= 0xDFFF:
            return m.group(0)
        return chr(code).encode("utf-8")

    return _JSON_ESCAPE.sub(one, data)


def _decoded_variants(data: bytes) -> list[bytes]:
    """The data as an upstream might decode it (percent, repeatedly; JSON escapes), excluding the raw form."""
    out: list[bytes] = []
    if b"%" in data:
        current = data
        for _ in range(_PERCENT_ROUNDS):
            decoded = unquote_to_bytes(current)
            if decoded == current:
                break
            out.append(decoded)
            current = decoded
            if b"%" not in current:
                break
    if b"\\" in data:
        unescaped = _json_unescape(data)
        if unescaped != data:
            out.append(unescaped)
    return out


def _shapes(buf: bytes, open_end: bool, slack: int) -> list[str]:
    """The placeholder-shaped values in lower-cased `buf`.

    With `open_end` (a stream chunk, more to come), a value shorter than a placeholder that
    ends within `slack` bytes of the end is left out: the next chunk may extend it.
    """
    if not open_end:
        return [m.decode("ascii") for m in PLACEHOLDER_PATTERN.findall(buf)]
    limit = len(buf) - slack
    return [
        m.group().decode("ascii")
        for m in PLACEHOLDER_PATTERN.finditer(buf)
        if m.end() < limit or m.end() - m.start() >= PLACEHOLDER_LENGTH
    ]


def _base64_hits(data: bytes, open_end: bool = False) -> set[str]:
    """Placeholders inside base64 runs of `data`, at any of the four alignments."""
    if len(data) < _MIN_RUN:
        return set()
    if b"\n" in data:
        data = data.replace(b"\r", b"").replace(b"\n", b"")
    if not _B64_PREFILTER.find_matches_as_indexes(data):
        return set()
    found: set[str] = set()
    for m in _B64_RUN.finditer(data):
        run = m.group().translate(_URLSAFE_TO_STD)
        # A run cut by the end of a stream chunk decodes to a cut value: wait for the rest.
        cut = open_end and m.end() == len(data)
        for offset in range(4):
            segment = run[offset:]
            rest = len(segment) % 4
            # A trailing partial group still carries whole bytes (2 or 3 characters: 1 or 2 bytes).
            segment = segment[:-1] if rest == 1 else segment + b"=" * (-rest % 4)
            try:
                decoded = binascii.a2b_base64(segment)
            except binascii.Error:
                continue
            found.update(_shapes(decoded.lower(), cut, _SLACK))
    return found


_PREFIX_BYTES = PLACEHOLDER_PREFIX.encode("ascii")
_NOTHING = BodyScan((), frozenset())
_NONE: frozenset[str] = frozenset()


def scan_body(data: bytes, *, open_end: bool = False) -> BodyScan:
    """Every placeholder in `data`: raw spans (for replacement) and those present only in an encoded form.

    `open_end`: `data` is a stream window with more to come (see `_shapes`).
    """
    if len(data) < _MIN_RUN and b"%" not in data and b"\\" not in data and _PREFIX_BYTES not in data.lower():
        return _NOTHING  # The common short header value: too short for base64, nothing to decode.
    lowered = data.lower()
    raw: tuple[tuple[int, int, str], ...] = ()
    if _PREFIX_BYTES in lowered:
        raw = tuple(
            (m.start(), m.end(), m.group().decode("ascii"))
            for m in PLACEHOLDER_PATTERN.finditer(lowered)
            if not open_end or m.end() < len(lowered) or m.end() - m.start() >= PLACEHOLDER_LENGTH
        )
    encoded: set[str] = set()
    variants = _decoded_variants(data)
    if variants:
        raw_counts = Counter(p for _, _, p in raw)
        for variant in variants:
            counts = Counter(_shapes(variant.lower(), open_end, _SLACK))
            encoded.update(p for p, n in counts.items() if n > raw_counts.get(p, 0))
    for variant in (data, *variants):
        encoded |= _base64_hits(variant, open_end)
    if not raw and not encoded:
        return _NOTHING
    return BodyScan(raw, frozenset(encoded))


def find_placeholders(data: bytes | str, *, open_end: bool = False) -> frozenset[str]:
    """Every placeholder-shaped value in `data`, raw or encoded, lower case."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    scan = scan_body(data, open_end=open_end)
    return _NONE if scan is _NOTHING else scan.placeholders


def _query_hits(query: str) -> list[Hit]:
    hits: list[Hit] = []
    named: set[str] = set()
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        name = unquote_to_bytes(key.replace("+", " ")).decode("utf-8", "replace")
        for p in find_placeholders(value):
            hits.append(Hit(p, Where(Part.QUERY, name)))
            named.add(p)
        for p in find_placeholders(key):
            hits.append(Hit(p, Where(Part.QUERY)))
    # Decoding the whole query can join what '&' split ("%26" is an '&' only once decoded).
    hits.extend(Hit(p, Where(Part.QUERY)) for p in find_placeholders(query) - named)
    return hits


def scan_request(request: BrokerRequest) -> tuple[list[Hit], BodyScan | None]:
    """Every placeholder in the host, path, query, headers and (buffered) body of a request."""
    hits = [Hit(p, Where(Part.HOST)) for p in find_placeholders(request.host)]
    hits.extend(Hit(p, Where(Part.PATH)) for p in find_placeholders(request.path))
    if request.query:
        hits.extend(_query_hits(request.query))
    for name, value in request.headers:
        hits.extend(Hit(p, Where(Part.HEADER, name.lower())) for p in find_placeholders(value))
        hits.extend(Hit(p, Where(Part.HEADER)) for p in find_placeholders(name))
    body: BodyScan | None = None
    if request.body:
        body = scan_body(request.body)
        hits.extend(Hit(p, Where(Part.BODY)) for p in dict.fromkeys(p for _, _, p in body.raw))
        hits.extend(Hit(p, Where(Part.BODY, "encoded")) for p in sorted(body.encoded))
    return hits, body


class StreamScanner:
    """Finds placeholders in a streamed body chunk by chunk, with a bounded tail.

    Each chunk is scanned together with the last `STREAM_TAIL` bytes before it, so a
    placeholder (or an encoding of one) split across chunk boundaries is found in the chunk
    that completes it, before that chunk is forwarded. A shorter placeholder-shaped value
    that the chunk ends in is reported with the next chunk (or at the end, `feed(b"")`),
    once it is known not to grow into a placeholder. Memory: one chunk plus the tail.
    """

    __slots__ = ("_tail", "found")

    def __init__(self) -> None:
        self._tail = b""
        self.found: set[str] = set()

    def feed(self, chunk: bytes) -> frozenset[str]:
        """Scan one chunk (b"" at the end of the body); return the placeholders first completed in it."""
        if not chunk:
            new = find_placeholders(self._tail) - self.found if self._tail else frozenset()
            self._tail = b""
        else:
            window = self._tail + chunk
            new = find_placeholders(window, open_end=True) - self.found
            self._tail = window[-STREAM_TAIL:]
        self.found |= new
        return frozenset(new)
