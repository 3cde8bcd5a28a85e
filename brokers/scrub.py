"""Response scrubbing: every real secret value, and its common encodings, becomes the placeholder.

Forms of each secret that are replaced: the raw bytes; base64 (standard and URL-safe) at
each of the three byte alignments (only the characters that depend on the secret alone, so
`Basic base64(user:secret)` is caught too; the replacement is the placeholder's base64 at the
same alignment); percent-encoded (upper- and lower-case hex, `+` for space); JSON-escaped the ways common
encoders write a string (`\\/`, `\\uXXXX` in either case, `<>&` escaped), and those forms
escaped once more (JSON text inside a JSON string: an MCP tool's structured result). All
forms of all secrets go into one Aho-Corasick automaton (leftmost-longest), built once per
set of secrets.

A stream keeps a tail of `max_form_length - 1` bytes between chunks, so a form split
across chunks is still replaced, and memory stays one chunk plus that tail.

A `Tally` passed in counts the replacements by the placeholder they put in (for the audit's
`secret_scrubbed` finding); a value with no match costs nothing more.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from urllib.parse import quote, quote_plus

import ahocorasick_rs

from sandgate.brokers.decoding import StreamDecoder
from sandgate.brokers.secret import Secret

__all__ = ["MIN_SCRUB_BYTES", "Scrubber", "StreamScrubber", "Tally", "secret_forms"]

# Shorter values cannot be replaced without mangling unrelated response text.
MIN_SCRUB_BYTES = 8

# Replacements made, by the placeholder each put in (never the secret).
Tally = dict[str, int]


def _b64_core(data: bytes, align: int) -> bytes:
    """The base64 characters that depend only on `data` when it starts `align` bytes into a group."""
    encoded = base64.b64encode(b"\0" * align + data + b"\0\0")
    return encoded[-(-8 * align // 6) : (8 * align + 8 * len(data)) // 6]


# A `\\uXXXX` escape (not an escaped backslash followed by `u`), its hex digits in group 2.
_U_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u([0-9a-f]{4})")
_HTML_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def _json_forms(text: str) -> set[str]:
    """The ways common JSON encoders write `text` inside a string: non-ASCII raw or `\\u`-escaped
    (lower- or upper-case hex), `/` raw or `\\/` (PHP), `<>&` raw or `\\u`-escaped (Go, Rails)."""
    forms: set[str] = set()
    for ascii_only in (False, True):
        base = json.dumps(text, ensure_ascii=ascii_only)[1:-1]
        for html in (base, base.translate(_HTML_ESCAPES)):
            for slash in (html, html.replace("/", "\\/")):
                forms.add(slash)
                forms.add(_U_ESCAPE.sub(lambda m: m.group(1) + "\\u" + m.group(2).upper(), slash))
    return forms


def _nested_json_forms(text: str) -> set[str]:
    """`_json_forms`, and each of them JSON-escaped once more: JSON text inside a JSON string,
    as an MCP tool's structured result is sent inside its text content."""
    once = _json_forms(text)
    twice = {json.dumps(form, ensure_ascii=a)[1:-1] for form in once for a in (False, True)}
    return once | twice


def secret_forms(value: bytes, placeholder: bytes) -> dict[bytes, bytes]:
    """Each encoded form of `value` → the same form of `placeholder`."""
    forms: dict[bytes, bytes] = {value: placeholder}
    for align in range(3):
        std = _b64_core(value, align)
        replacement = _b64_core(placeholder, align)
        forms.setdefault(std, replacement)
        forms.setdefault(
            std.replace(b"+", b"-").replace(b"/", b"_"), replacement.replace(b"+", b"-").replace(b"/", b"_")
        )
    quoted = quote(value, safe="")
    for form in (
        quoted,
        _lower_hex(quoted),
        quote_plus(value, safe=""),
        _lower_hex(quote_plus(value, safe="")),
    ):
        forms.setdefault(form.encode("ascii"), placeholder)
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        for form_text in _nested_json_forms(text):
            forms.setdefault(form_text.encode("utf-8"), placeholder)
    return {k: v for k, v in forms.items() if len(k) >= MIN_SCRUB_BYTES}


def _lower_hex(quoted: str) -> str:
    parts = quoted.split("%")
    return parts[0] + "".join("%" + p[:2].lower() + p[2:] for p in parts[1:])


class Scrubber:
    """Replaces secrets by placeholders in whole values (`scrub`, `scrub_text`) or streams (`stream`).

    Built from (secret, placeholder) pairs; secrets shorter than MIN_SCRUB_BYTES are refused
    by the broker before they get here and skipped if they do.
    """

    __slots__ = ("_automaton", "_patterns", "_placeholders", "_replacements", "max_form_length")

    def __init__(self, pairs: Iterable[tuple[Secret, str]]) -> None:
        table: dict[bytes, tuple[bytes, str]] = {}
        for secret, placeholder in pairs:
            value = secret.reveal_bytes()
            if len(value) < MIN_SCRUB_BYTES:
                continue
            for form, replacement in secret_forms(value, placeholder.encode("ascii")).items():
                table.setdefault(form, (replacement, placeholder))
        self._patterns: Sequence[bytes] = list(table)
        self._replacements: Sequence[bytes] = [table[p][0] for p in self._patterns]
        self._placeholders: Sequence[str] = [table[p][1] for p in self._patterns]
        self.max_form_length = max((len(p) for p in self._patterns), default=0)
        self._automaton = (
            ahocorasick_rs.BytesAhoCorasick(
                self._patterns,
                matchkind=ahocorasick_rs.MatchKind.LeftmostLongest,
                implementation=ahocorasick_rs.Implementation.DFA,
            )
            if self._patterns
            else None
        )

    def __repr__(self) -> str:
        return f"Scrubber(<{len(self._patterns)} forms>)"

    @property
    def empty(self) -> bool:
        """Whether there is nothing to scrub (no secret known yet)."""
        return self._automaton is None

    def scrub(self, data: bytes, tally: Tally | None = None) -> bytes:
        """`data` with every secret form replaced (counted in `tally`)."""
        out, rest = self._scrub_until(data, len(data), tally)
        return out + rest

    def scrub_text(self, text: str, tally: Tally | None = None) -> str:
        """A header value (or any text) with every secret form replaced."""
        if self._automaton is None:
            return text
        data = text.encode("utf-8", "surrogateescape")
        return self.scrub(data, tally).decode("utf-8", "surrogateescape")

    def scrub_headers(
        self, headers: Iterable[tuple[str, str]], tally: Tally | None = None
    ) -> list[tuple[str, str]]:
        """Header pairs with every secret form replaced in names and values."""
        return [(self.scrub_text(k, tally), self.scrub_text(v, tally)) for k, v in headers]

    def stream(self, decoder: StreamDecoder | None = None, tally: Tally | None = None) -> StreamScrubber:
        """A scrubber for one streamed body (decoded first by `decoder`, if it is compressed)."""
        return StreamScrubber(self, decoder, tally)

    def _scrub_until(self, data: bytes, boundary: int, tally: Tally | None = None) -> tuple[bytes, bytes]:
        """Scrub matches starting before `boundary`; return (output, unprocessed tail)."""
        automaton = self._automaton
        if automaton is None:
            return data[:boundary], data[boundary:]
        matches = automaton.find_matches_as_indexes(data)
        if not matches:
            return data[:boundary], data[boundary:]
        pieces: list[bytes] = []
        pos = 0
        for index, start, end in matches:
            if start >= boundary:
                break
            pieces.append(data[pos:start])
            pieces.append(self._replacements[index])
            if tally is not None:
                placeholder = self._placeholders[index]
                tally[placeholder] = tally.get(placeholder, 0) + 1
            pos = end
        cut = max(pos, boundary)
        pieces.append(data[pos:cut])
        return b"".join(pieces), data[cut:]


class StreamScrubber:
    """Scrubs one body chunk by chunk; `feed` returns what is safe to send, `flush` the rest.

    With a `decoder` (a compressed body), each chunk is decoded first and what is sent on is
    the identity encoding. Usable as a mitmproxy stream callable: called with b"" at the end,
    it flushes. As one it yields the pieces to send and never an empty one, since on HTTP/1
    a chunked body's empty chunk is its end (the guest would get 0 bytes).
    """

    __slots__ = ("_decoder", "_keep", "_scrubber", "_tail", "_tally")

    def __init__(
        self, scrubber: Scrubber, decoder: StreamDecoder | None = None, tally: Tally | None = None
    ) -> None:
        self._scrubber = scrubber
        self._decoder = decoder
        self._tally = tally
        self._keep = max(scrubber.max_form_length - 1, 0)
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        """Scrub a chunk; up to max_form_length-1 bytes are held back until the next one."""
        if self._scrubber.empty:
            return chunk
        data = self._tail + chunk if self._tail else chunk
        out, self._tail = self._scrubber._scrub_until(data, max(len(data) - self._keep, 0), self._tally)
        return out

    def flush(self) -> bytes:
        """The held-back tail, scrubbed."""
        data, self._tail = self._tail, b""
        return self._scrubber.scrub(data, self._tally) if data else b""

    def __call__(self, chunk: bytes) -> Iterator[bytes]:
        for piece in self._decoded(chunk):
            out = self.feed(piece)
            if out:
                yield out
        if not chunk:
            out = self.flush()
            if out:
                yield out

    def _decoded(self, chunk: bytes) -> Iterable[bytes]:
        """`chunk` as content: decoded where the body is compressed (at the end, what the
        decoder still held); raises UndecodableBody for a body its encoding cannot read."""
        if self._decoder is None:
            return (chunk,) if chunk else ()
        return self._decoder.feed(chunk) if chunk else self._decoder.finish()
