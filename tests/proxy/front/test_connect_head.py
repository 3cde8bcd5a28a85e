"""What the passthrough front takes for a plain CONNECT, and what it leaves to mitmproxy."""

from __future__ import annotations

import pytest

from sandgate.proxy.front.connect_head import ConnectHead, looks_like_connect, read_connect_head

AUTH = "Basic c2IxOnRva2Vu"
CAPS = {"max_bytes": 64 * 1024, "max_lines": 100}


def head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def test_a_plain_connect_is_read_with_its_credential_and_size() -> None:
    data = head("CONNECT api.test:443 HTTP/1.1", "Host: api.test:443", f"Proxy-Authorization: {AUTH}")
    read = read_connect_head(data + b"\x16\x03\x01", **CAPS)
    assert read == ConnectHead("api.test:443", "HTTP/1.1", AUTH, len(data))
    assert AUTH not in repr(read), "the credential never shows in a repr"


@pytest.mark.parametrize(
    "data",
    [
        head("GET http://api.test/ HTTP/1.1", "Host: api.test"),
        head("connect api.test:443 HTTP/1.1"),
        head("CONNECT api.test:443 HTTP/2"),
        head("CONNECT api.test:443"),
        head("CONNECT  api.test:443 HTTP/1.1"),
        head("CONNECT api.test:443 HTTP/1.1", f"Proxy-Authorization: {AUTH}", f"Proxy-Authorization: {AUTH}"),
        head("CONNECT api.test:443 HTTP/1.1", "Content-Length: 5"),
        head("CONNECT api.test:443 HTTP/1.1", "Transfer-Encoding: chunked"),
        head("CONNECT api.test:443 HTTP/1.1", "Upgrade: h2c"),
        head("CONNECT api.test:443 HTTP/1.1", "X-A: 1", " folded"),
        head("CONNECT api.test:443 HTTP/1.1", "Proxy-Authorization : " + AUTH),
        head("CONNECT api.test:443 HTTP/1.1", "X-Bad: caf\xe9"),
        head("CONNECT api.test:443 HTTP/1.1", "X-Bad: a\rb"),
        head("CONNECT api.t\xe9st:443 HTTP/1.1"),
        head("CONNECT api.test:443 HTTP/1.1", "no colon"),
        b"CONNECT api.test:443 HTTP/1.1\r\nHost: api.test",
        b"CONNECT api.test:443 HTTP/1.1\nHost: api.test\n\n",
    ],
    ids=[
        "not a CONNECT",
        "a lower-case method",
        "another HTTP version",
        "no version",
        "two spaces",
        "two credentials",
        "a body length",
        "a chunked body",
        "an upgrade",
        "an obs-fold",
        "a space before the colon",
        "a byte outside ASCII in a value",
        "a bare CR in a value",
        "a byte outside ASCII in the target",
        "a line without a colon",
        "a head not complete",
        "bare LF line ends",
    ],
)
def test_anything_but_a_plain_connect_is_left_to_mitmproxy(data: bytes) -> None:
    assert read_connect_head(data, **CAPS) is None


def test_a_head_past_the_caps_is_left_to_mitmproxy_which_answers_431() -> None:
    data = head("CONNECT api.test:443 HTTP/1.1", *(f"X-{i}: {i}" for i in range(20)))
    assert read_connect_head(data, max_bytes=64 * 1024, max_lines=100) is not None
    assert read_connect_head(data, max_bytes=64 * 1024, max_lines=20) is None
    assert read_connect_head(data, max_bytes=len(data) - 1, max_lines=100) is None


@pytest.mark.parametrize(
    ("data", "maybe"),
    [
        (b"", True),
        (b"CON", True),
        (b"CONNECT ", True),
        (b"CONNECT x", True),
        (b"GET ", False),
        (b"\x16\x03", False),
    ],
)
def test_a_prefix_is_known_not_to_be_a_connect_at_its_first_byte(data: bytes, maybe: bool) -> None:
    assert looks_like_connect(data) is maybe
