"""What the console explains for a record: the request `policy explain` is given, rebuilt
from the record's fields (the scheme inferred, connection-level records as CONNECT)."""

from __future__ import annotations

import pytest

from sandgate.proxy.console.explain import request_text

CASES = [
    (
        {"phase": "request", "method": "GET", "host": "api.test", "port": "443", "path": "/v1/x"},
        "GET https://api.test:443/v1/x",
    ),
    (
        {"phase": "request", "method": "post", "host": "api.test", "port": "8080", "path": "/p?q=<redacted>"},
        "POST http://api.test:8080/p?q=<redacted>",
    ),
    (
        {"phase": "request", "method": "GET", "host": "api.test", "port": "8443", "sni": "api.test"},
        "GET https://api.test:8443/",
    ),
    ({"phase": "connect", "host": "evil.test", "port": "443"}, "CONNECT evil.test:443"),
    ({"phase": "tls", "method": "", "host": "evil.test", "port": "8443"}, "CONNECT evil.test:8443"),
    ({"phase": "connect", "host": "2001:db8::1", "port": "443"}, "CONNECT [2001:db8::1]:443"),
    ({"host": "x.test"}, "CONNECT x.test:443"),
]


@pytest.mark.parametrize(
    ("fields", "expected"),
    CASES,
    ids=[
        "a request to 443 is https",
        "a request to another port without SNI is http, its method upper-cased",
        "a request with an SNI is https on any port",
        "a connect record is a CONNECT",
        "a tls record is a CONNECT",
        "an IPv6 address is bracketed",
        "a record with no phase is a CONNECT to 443",
    ],
)
def test_the_request_a_record_describes(fields: dict[str, str], expected: str) -> None:
    assert request_text(fields) == expected


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"phase": "request", "method": "GET"}, "the record names no host"),
        ({"host": "a.test", "port": "http"}, "the record's port is not a port number"),
        ({"host": "a.test", "port": "70000"}, "the record's port is not a port number"),
    ],
    ids=["no host", "a port that is no number", "a port out of range"],
)
def test_a_record_without_a_request_is_refused(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        request_text(fields)
