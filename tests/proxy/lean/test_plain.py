"""Which requests the lean HTTP/1.1 layer serves itself: a plain head, decided from the head alone.
Everything else goes to mitmproxy's general path, which refuses or serves it as it always did."""

from __future__ import annotations

import pytest

from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.lean.choose import ENV_HTTP1_PATH, http1_path
from sandgate.proxy.lean.plain import plain_request


def _lines(head: bytes) -> list[bytes]:
    return head.split(b"\r\n")


SERVED = {
    "a GET": (b"GET /v1/models?x=1 HTTP/1.1\r\nHost: api.test", 0),
    "a POST with Content-Length": (b"POST /v1 HTTP/1.1\r\nHost: api.test\r\nContent-Length: 12", 12),
    "Connection: close": (b"GET / HTTP/1.1\r\nHost: api.test\r\nConnection: close", 0),
}


@pytest.mark.parametrize(("head", "size"), SERVED.values(), ids=list(SERVED))
def test_a_plain_request_is_read_with_its_body_size(head: bytes, size: int) -> None:
    plain = plain_request(_lines(head))
    assert plain is not None
    request, got = plain
    assert got == size
    assert request.host_header == "api.test"


NOT_SERVED = {
    "HTTP/1.0": b"GET / HTTP/1.0\r\nHost: api.test",
    "an absolute-form target": b"GET http://api.test/ HTTP/1.1\r\nHost: api.test",
    "CONNECT": b"CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443",
    "an upgrade": b"GET / HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade",
    "an h2c offer without Upgrade": b"GET / HTTP/1.1\r\nHost: api.test\r\nHTTP2-Settings: AAMAAABkAAQAAP__",
    "Expect": b"POST / HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\nContent-Length: 2",
    "TE: trailers": b"GET / HTTP/1.1\r\nHost: api.test\r\nTE: trailers",
    "a Trailer field": b"POST / HTTP/1.1\r\nHost: api.test\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked",
    "a chunked upload": b"POST /v1 HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked",
    "a transfer coding but chunked": b"POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: gzip, chunked",
    "a header name mitmproxy's smuggling check refuses": b"GET / HTTP/1.1\r\nHost: api.test\r\nX Bad: 1",
    "Content-Length with Transfer-Encoding": (
        b"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked"
    ),
    "two Content-Lengths": b"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\nContent-Length: 6",
    "a bad Content-Length": b"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: -1",
    "no request line": b"garbage",
    "a header line without a colon": b"GET / HTTP/1.1\r\nHost api.test",
}


@pytest.mark.parametrize("head", NOT_SERVED.values(), ids=list(NOT_SERVED))
def test_anything_else_is_left_to_the_general_path(head: bytes) -> None:
    assert plain_request(_lines(head)) is None


def test_an_empty_head_is_left_to_the_general_path() -> None:
    assert plain_request([]) is None


def test_without_the_smuggling_check_a_bad_header_name_is_read() -> None:
    """`validate_inbound_headers` off (as mitmproxy allows): the lean layer reads what the
    general path would read."""
    assert plain_request(_lines(b"GET / HTTP/1.1\r\nHost: api.test\r\nX Bad: 1"), strict=False) is not None


def test_the_path_comes_from_the_config_then_the_environment_then_lean() -> None:
    assert http1_path(GatewayConfig(), env={}) == "lean"
    assert http1_path(GatewayConfig(), env={ENV_HTTP1_PATH: "general"}) == "general"
    named = GatewayConfig.model_validate({"interception": {"http1_path": "lean"}})
    assert http1_path(named, env={ENV_HTTP1_PATH: "general"}) == "lean"
    with pytest.raises(ConfigError, match=r"\$SANDGATE_HTTP1_PATH must be 'general' or 'lean', not 'fast'"):
        http1_path(GatewayConfig(), env={ENV_HTTP1_PATH: "fast"})
