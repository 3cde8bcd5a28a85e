"""Scrubbing the ways JSON encoders write a secret: a secret with `/`, `"`, `<>&` or non-ASCII
is written escaped (`\\/`, `\\"`, `\\u00e9` or `\\u00E9`, `\\u003c`), and an MCP tool's result
can be JSON text inside a JSON string, escaped twice. Every such form becomes the placeholder."""

from __future__ import annotations

import json
import re

import pytest

from sandgate.brokers import Scrubber, Secret

SECRET = 'ghp_REAL/"x"<&>-é-0123456789'
P = "sgph_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"


def upper_hex(text: str) -> str:
    return re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m.group(1).upper(), text)


def go(text: str) -> str:
    """Go's encoding/json: non-ASCII raw, `<>&` as \\u escapes."""
    return (
        json.dumps(text, ensure_ascii=False)
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )


FORMS = {
    "Python's json (ASCII only)": json.dumps(SECRET),
    "pydantic and JavaScript (UTF-8 raw)": json.dumps(SECRET, ensure_ascii=False),
    "upper-case hex escapes (Java, .NET)": upper_hex(json.dumps(SECRET)),
    "PHP's json_encode (slashes escaped)": json.dumps(SECRET).replace("/", "\\/"),
    "Go's encoding/json (<>& escaped)": go(SECRET),
    "JSON text inside a JSON string": json.dumps(json.dumps({"token": SECRET})),
    "JSON text inside a JSON string, UTF-8 raw": json.dumps(
        json.dumps({"t": SECRET}, ensure_ascii=False), ensure_ascii=False
    ),
}


@pytest.mark.parametrize("form", FORMS.values(), ids=[f"as {k} writes it, it is scrubbed" for k in FORMS])
def test_a_json_written_secret_becomes_the_placeholder(form: str) -> None:
    scrubber = Scrubber([(Secret(SECRET), P)])
    out = scrubber.scrub(b'{"result": ' + form.encode() + b"}")
    assert P.encode() in out
    assert SECRET.encode() not in out
    # Nothing of the secret's own text is left but what the placeholder replaced around it.
    assert b"0123456789" not in out and b"ghp_REAL" not in out


@pytest.mark.parametrize("form", FORMS.values(), ids=[f"as {k} writes it, cut anywhere" for k in FORMS])
def test_a_json_written_secret_cut_at_every_offset_is_scrubbed_in_a_stream(form: str) -> None:
    scrubber = Scrubber([(Secret(SECRET), P)])
    data = b"data: " + form.encode() + b"\n\n"
    for cut in range(1, len(data)):
        stream = scrubber.stream()
        out = b"".join([*stream(data[:cut]), *stream(data[cut:]), *stream(b"")])
        assert out == scrubber.scrub(data) and b"ghp_REAL" not in out


def test_an_escaped_backslash_before_u_is_not_read_as_an_escape() -> None:
    literal = "key\\u00e9-0123456789"  # the secret holds a backslash and `u00e9` as text
    scrubber = Scrubber([(Secret(literal), P)])
    written = json.dumps(literal)  # "key\\u00e9-..."
    assert P.encode() in scrubber.scrub(written.encode())
    # The same text with the escape upper-cased is another value (`key\u00E9...`): left alone.
    other = written.replace("u00e9", "u00E9")
    assert scrubber.scrub(other.encode()) == other.encode()
