"""Which HTTP/1.1 requests the lean layer serves: the plain ones, decided from the head alone."""

from __future__ import annotations

from mitmproxy import http
from mitmproxy.net.http import http1
from mitmproxy.net.http.validate import validate_headers

__all__ = ["plain_request"]

# Fields whose meaning the lean layer does not implement: the general path serves them.
_GENERAL_FIELDS = ("upgrade", "expect", "te", "trailer", "http2-settings")


def plain_request(lines: list[bytes], *, strict: bool = True) -> tuple[http.Request, int] | None:
    """The request and its body's length if the lean layer can serve the head made of `lines`
    (as h11's buffer extracts them), or None: the general path serves it.

    None for anything mitmproxy's reader refuses, and with `strict` (mitmproxy's
    `validate_inbound_headers`) anything its smuggling check refuses (the general path answers
    both in sandgate's shape and audits them); for another version than HTTP/1.1, a target
    that is not origin-form, CONNECT, an upgrade, `Expect`, trailers, and a body that is not
    framed by Content-Length (chunked uploads stream through the general path).
    """
    if not lines:
        return None
    try:
        request = http1.read_request_head(lines)
        size = http1.expected_http_body_size(request)
        if strict:
            validate_headers(request)
    except ValueError:
        return None
    if request.http_version != "HTTP/1.1" or request.authority or request.method == "CONNECT":
        return None
    headers = request.headers
    if "transfer-encoding" in headers or any(name in headers for name in _GENERAL_FIELDS):
        return None
    if size is None or size < 0:
        return None  # chunked, or read until EOF
    return request, size
