"""Hop-by-hop header fields stay on their hop: the table on real mitmproxy messages, then
end to end through a real gateway to a recording upstream, both directions."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator

import httpx
import pytest
from conftest import TOKEN, UPSTREAM_IP, GatewayFactory, RunningGateway, tenant_yaml
from mitmproxy import http
from support import RecordingUpstream

from sandgate.proxy.addons.hop_by_hop import strip_hop_by_hop


def fields(pairs: list[tuple[str, str]]) -> http.Headers:
    return http.Headers([(k.encode(), v.encode()) for k, v in pairs])


def request(headers: list[tuple[str, str]], version: str = "HTTP/1.1") -> http.Request:
    req = http.Request.make("GET", "http://api.test/x")
    req.headers, req.http_version = fields(headers), version
    return req


STRIPPED = [
    ([("Proxy-Connection", "keep-alive")], [], "proxy-connection is dropped"),
    ([("Keep-Alive", "timeout=5")], [], "keep-alive is dropped"),
    ([("TE", "trailers")], [], "te is dropped on http/1.1, trailers too"),
    ([("Proxy-Authorization", "Basic eA==")], [], "proxy-authorization is dropped"),
    ([("Proxy-Authenticate", "Basic")], [], "proxy-authenticate is dropped"),
    (
        [("Connection", "keep-alive, X-Hop"), ("X-Hop", "1"), ("X-End", "2")],
        [("Connection", "keep-alive"), ("X-End", "2")],
        "a field the connection header names is dropped, the connection's own token kept",
    ),
    (
        [("Connection", "X-A"), ("Connection", "x-b"), ("X-A", "1"), ("X-B", "2"), ("x-c", "3")],
        [("x-c", "3")],
        "names from every connection header count, in any case",
    ),
    (
        [("Connection", "close, Content-Length, Transfer-Encoding, Host"), ("Content-Length", "4")],
        [("Connection", "close"), ("Content-Length", "4")],
        "a connection header cannot remove framing or host fields",
    ),
    (
        [("Connection", "Upgrade"), ("Upgrade", "websocket")],
        [("Connection", "Upgrade"), ("Upgrade", "websocket")],
        "upgrade is left to the upgrade check",
    ),
    ([("X-End", "2")], [("X-End", "2")], "end-to-end fields pass untouched"),
]


@pytest.mark.parametrize(("sent", "kept"), [c[:2] for c in STRIPPED], ids=[c[2] for c in STRIPPED])
def test_strip_hop_by_hop(sent: list[tuple[str, str]], kept: list[tuple[str, str]]) -> None:
    req = request(sent)
    strip_hop_by_hop(req)
    assert list(req.headers.items(multi=True)) == kept


def test_te_trailers_is_kept_on_http2_and_any_other_te_is_not() -> None:
    kept = request([("te", "trailers")], "HTTP/2.0")
    strip_hop_by_hop(kept)
    assert kept.headers.get_all("te") == ["trailers"]
    dropped = request([("te", "gzip")], "HTTP/2.0")
    strip_hop_by_hop(dropped)
    assert dropped.headers.get_all("te") == []


def test_a_response_loses_its_hop_by_hop_fields() -> None:
    sent = [("Keep-Alive", "timeout=5"), ("Connection", "X-Hop"), ("X-Hop", "1"), ("X-End", "2")]
    response = http.Response.make(200)
    response.headers = fields(sent)
    strip_hop_by_hop(response)
    assert [(k, v) for k, v in response.headers.items(multi=True) if k != "content-length"] == [
        ("X-End", "2")
    ]


# --- end to end ---------------------------------------------------------------------------


@pytest.fixture
def hop_upstream() -> Iterator[RecordingUpstream]:
    """An upstream whose responses carry hop-by-hop fields."""
    headers = [
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Connection", "keep-alive"),
        ("Proxy-Authenticate", 'Basic realm="upstream"'),
        ("Connection", "X-Upstream-Hop"),
        ("X-Upstream-Hop", "1"),
        ("X-End", "2"),
    ]
    with RecordingUpstream(UPSTREAM_IP, name="hop", headers=headers) as up:
        yield up


@pytest.fixture
def gateway(start_gateway: GatewayFactory, hop_upstream: RecordingUpstream) -> RunningGateway:
    return start_gateway(
        {"t1.yaml": tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [hop_upstream.port]}])}
    )


@pytest.mark.slow
def test_hop_by_hop_request_fields_never_reach_the_upstream(
    gateway: RunningGateway, hop_upstream: RecordingUpstream
) -> None:
    auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    head = (
        f"POST http://api.test:{hop_upstream.port}/x HTTP/1.1\r\n"
        f"Host: api.test:{hop_upstream.port}\r\n"
        f"Proxy-Authorization: Basic {auth}\r\n"
        "Connection: close, X-Hop, Content-Length, Host\r\n"
        "Proxy-Connection: keep-alive\r\n"
        "Keep-Alive: timeout=5\r\n"
        "TE: gzip, trailers\r\n"
        "X-Hop: drop me\r\n"
        "X-End: keep me\r\n"
        "Content-Length: 4\r\n\r\nbody"
    )
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
        s.sendall(head.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 ")
    (req,) = hop_upstream.requests
    names = {k.lower() for k, _ in req.headers}
    assert names.isdisjoint({"proxy-connection", "keep-alive", "te", "x-hop", "proxy-authorization"})
    assert (req.header("X-End"), req.header("Connection"), req.header("Host")) == (
        "keep me",
        "close",
        f"api.test:{hop_upstream.port}",
    )
    assert (req.header("Content-Length"), req.body) == ("4", b"body"), "framing fields are never dropped"


@pytest.mark.slow
def test_hop_by_hop_response_fields_never_reach_the_guest(
    gateway: RunningGateway, hop_upstream: RecordingUpstream
) -> None:
    with httpx.Client(proxy=gateway.proxy(), timeout=10) as client:
        resp = client.get(f"{hop_upstream.url_for('api.test')}/x")
    assert resp.status_code == 200
    assert resp.headers.get("X-End") == "2"
    for name in ("Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "X-Upstream-Hop"):
        assert name not in resp.headers, name
