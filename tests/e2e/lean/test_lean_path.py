"""The lean HTTP/1.1 path (`interception.http1_path: lean`) beside mitmproxy's general path.

Two real gateways with the same tenant, one on each path, before one recording TLS upstream:
the same exchanges, sent as raw bytes through a CONNECT tunnel, must reach the upstream as
the same requests, come back to the guest as the same answers and leave the same audit
records; the lean gateway's counters must show that its lean layer served them. What the lean
layer does not serve (a partial head, an upgrade, `Expect`, a chunked request body) is served
by the general path, on the same connection, as on the general gateway.

The rest of the suite runs on the lean path (the default); tests/run.sh runs the intercepted
suites that matter most again with `SANDGATE_HTTP1_PATH=general`.
"""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from conftest import TOKEN, TOKEN_REF, GatewayFactory, RunningGateway
from support import RecordingUpstream, TestPKI
from support.tunnels import lean_counters, open_tunnel, tls_tunnel

pytestmark = pytest.mark.slow

UPSTREAM_IP = "127.0.0.2"
REAL = "sk-live-LEAN-PATH-0123456789abcdef"
PATHS = ("general", "lean")
# Headers whose values differ between two runs of one exchange (time, ids, the gateway's port).
VOLATILE = {"date", "x-sandgate-decision-id", "content-length"}
DECISION_ID = re.compile(rb'"decision_id": "[0-9a-f]+"')


def _tenant(port: int) -> str:
    doc = {
        "tenant": "t1",
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
        "allow": [{"hosts": ["api.test"], "ports": [port], "inspect": True}],
        "deny": [{"id": "no-admin", "hosts": ["api.test"], "paths": ["/admin/**"]}],
        "credentials": [
            {
                "name": "openai",
                "secret": "env:SANDGATE_TEST_LEAN_SECRET",
                "hosts": ["api.test"],
                "ports": [port],
                "env": "OPENAI_API_KEY",
                "inject": {"header": "Authorization", "format": "Bearer {secret}"},
            }
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class Pair:
    upstream: RecordingUpstream
    gateways: dict[str, RunningGateway]
    placeholders: dict[str, str]  # each gateway's own, for sb1's key

    def tunnel(self, path: str) -> ssl.SSLSocket:
        """A TLS connection to api.test through a CONNECT on the `path` gateway."""
        return tls_tunnel(self.gateways[path], self.upstream.port)


@pytest.fixture(scope="module")
def pair(start_module_gateway: GatewayFactory, pki: TestPKI) -> Iterator[Pair]:
    with RecordingUpstream(UPSTREAM_IP, tls=pki, name="lean-upstream") as up:
        gateways = {
            path: start_module_gateway(
                {"t1.yaml": _tenant(up.port)},
                config={"interception": {"http1_path": path}},
                env={"SANDGATE_TEST_LEAN_SECRET": REAL},
            )
            for path in PATHS
        }
        yield Pair(up, gateways, {p: gw.placeholders()["OPENAI_API_KEY"] for p, gw in gateways.items()})


def _read_response(
    tls: ssl.SSLSocket, buffered: bytes = b"", *, head_only: bool = False
) -> tuple[bytes, bytes]:
    """One response (head and Content-Length or chunked body; `head_only`: the answer to a HEAD)
    read off `tls`; (it, what followed)."""
    data = buffered
    while b"\r\n\r\n" not in data:
        data += _recv(tls)
    head, _, rest = data.partition(b"\r\n\r\n")
    if head_only:
        return head + b"\r\n\r\n", rest
    fields = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
    }
    if fields.get(b"transfer-encoding") == b"chunked":
        while not rest.endswith(b"0\r\n\r\n"):
            rest += _recv(tls)
        return head + b"\r\n\r\n" + rest, b""
    length = int(fields.get(b"content-length", b"0"))
    while len(rest) < length:
        rest += _recv(tls)
    return head + b"\r\n\r\n" + rest[:length], rest[length:]


def _recv(tls: ssl.SSLSocket) -> bytes:
    chunk = tls.recv(65536)
    if not chunk:
        raise ConnectionError("closed before the response was whole")
    return chunk


def _comparable(response: bytes) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    """Status line, the headers that do not vary between runs, the body."""
    head, _, body = response.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(b":") for line in lines)]
    kept = [(k, v) for k, v in headers if k.decode() not in VOLATILE]
    return status, kept, DECISION_ID.sub(b'"decision_id": "-"', body)


def _record_fields(record: dict[str, Any]) -> dict[str, Any]:
    """What two gateways must agree on for one exchange."""
    keep = ("phase", "method", "path", "decision", "reason", "rule_id", "credentials", "status", "error")
    return {k: record.get(k) for k in keep} | {"bytes": record.get("bytes")}


# Each exchange: the raw request (the placeholder as {ph}) and how many responses it gets.
EXCHANGES = {
    "a GET": b"GET /v1/models?limit=2 HTTP/1.1\r\nHost: api.test\r\nAccept: */*\r\n\r\n",
    "a POST with a body and the placeholder": (
        b"POST /v1/chat HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer {ph}\r\n"
        b"Content-Type: application/json\r\nContent-Length: 27\r\n\r\n"
        b'{"model":"m","input":"hi!"}'
    ),
    "a HEAD": b"HEAD /v1/models HTTP/1.1\r\nHost: api.test\r\n\r\n",
    "a denied path": b"DELETE /admin/users HTTP/1.1\r\nHost: api.test\r\nContent-Length: 0\r\n\r\n",
    "a request that closes": b"GET /bye HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n",
}


def _exchange(pair: Pair, path: str, raw: bytes) -> tuple[bytes, list[Any], list[dict[str, Any]]]:
    """Send `raw` (twice, keep-alive, unless it closes) through the `path` gateway: the last
    response, what the upstream received, the records."""
    gw = pair.gateways[path]
    gw.mark()
    pair.upstream.reset()
    request = raw.replace(b"{ph}", pair.placeholders[path].encode())
    rounds = 1 if b"Connection: close" in raw else 2
    with pair.tunnel(path) as tls:
        for _ in range(rounds):
            tls.sendall(request)
            response, _ = _read_response(tls, head_only=raw.startswith(b"HEAD "))
    response = response.replace(pair.placeholders[path].encode(), b"{ph}")  # the echo, scrubbed
    received = [(r.method, r.target, r.headers, r.body) for r in pair.upstream.requests]
    records = [r for r in gw.records_until(lambda rs: sum(r["phase"] == "request" for r in rs) >= rounds)]
    return response, received, [r for r in records if r["phase"] == "request"]


@pytest.mark.parametrize("raw", EXCHANGES.values(), ids=list(EXCHANGES))
def test_an_exchange_is_the_same_on_both_paths_and_the_lean_layer_serves_it(pair: Pair, raw: bytes) -> None:
    before = lean_counters(pair.gateways["lean"])
    got = {path: _exchange(pair, path, raw) for path in PATHS}
    (general, general_upstream, general_records), (lean, lean_upstream, lean_records) = got.values()
    assert _comparable(lean) == _comparable(general), (lean, general)
    assert lean_upstream == general_upstream, "the upstream received the same requests"
    assert [_record_fields(r) for r in lean_records] == [_record_fields(r) for r in general_records]
    after = lean_counters(pair.gateways["lean"])
    served = after["sandgate_http1_lean_exchanges_total"] - before.get(
        "sandgate_http1_lean_exchanges_total", 0
    )
    assert served == len(lean_records), "the lean layer served every exchange"
    assert not {k: v for k, v in after.items() if "handovers" in k and v != before.get(k)}, (
        "nothing handed over"
    )
    if b"{ph}" in raw:
        (sent,) = {dict(h)["Authorization"] for _, _, h, _ in lean_upstream}
        assert sent == f"Bearer {REAL}", "the credential was injected on the lean path"
        assert REAL.encode() not in lean, "and nothing of it came back"


HANDED_OVER = {
    "a head in two pieces": ([b"GET /one HTTP/1.1\r\nHo", b"st: api.test\r\n\r\n"], "partial_head"),
    "Expect: 100-continue": (
        [b"POST /e HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok"],
        "not_plain",
    ),
    "a chunked request body": (
        [b"POST /c HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"],
        "not_plain",
    ),
}


@pytest.mark.parametrize(("pieces", "reason"), HANDED_OVER.values(), ids=list(HANDED_OVER))
def test_what_the_lean_layer_does_not_serve_the_general_path_serves_on_the_same_connection(
    pair: Pair, pieces: list[bytes], reason: str
) -> None:
    gw = pair.gateways["lean"]
    before = lean_counters(gw)
    gw.mark()
    with pair.tunnel("lean") as tls:
        buffered = b""
        for piece in pieces:
            tls.sendall(piece)
            time.sleep(0.2)  # each piece its own read
        while True:
            response, buffered = _read_response(tls, buffered)
            if not response.startswith(b"HTTP/1.1 100"):
                break
        assert response.startswith(b"HTTP/1.1 200"), response[:200]
        tls.sendall(b"GET /after HTTP/1.1\r\nHost: api.test\r\n\r\n")
        after_response, _ = _read_response(tls, buffered)
        assert after_response.startswith(b"HTTP/1.1 200")
    records = gw.records_until(lambda rs: sum(r["phase"] == "request" for r in rs) >= 2)
    assert [(r["decision"], r["status"]) for r in records if r["phase"] == "request"] == [("allow", 200)] * 2
    after = lean_counters(gw)
    key = f"sandgate_http1_lean_handovers_total:{reason}"
    assert after.get(key, 0) - before.get(key, 0) == 1
    assert after["sandgate_http1_lean_exchanges_total"] == before.get(
        "sandgate_http1_lean_exchanges_total", 0
    )


@pytest.mark.parametrize("path", PATHS)
def test_half_a_request_head_gets_the_408_in_time(
    start_gateway: GatewayFactory, pki: TestPKI, path: str
) -> None:
    """mitmproxy starts the tunnel's HTTP layer on its first bytes: a half-sent head is handed
    to the general path, whose clock started then, as it starts on the general gateway."""
    sent = b"GET /slow HTTP/1.1\r\nHost: api"
    with RecordingUpstream(UPSTREAM_IP, tls=pki, name="lean-slow") as up:
        gw = start_gateway(
            {"t1.yaml": _tenant(up.port)},
            config={"interception": {"http1_path": path}, "heads": {"read_timeout_seconds": 1}},
            env={"SANDGATE_TEST_LEAN_SECRET": REAL},
        )
        context = ssl.create_default_context(cafile=str(gw.ca_file))
        context.set_alpn_protocols(["http/1.1"])  # the HTTP layer starts at the handshake
        with context.wrap_socket(open_tunnel(gw, f"api.test:{up.port}"), server_hostname="api.test") as tls:
            tls.settimeout(10)
            started = time.monotonic()
            tls.sendall(sent)
            data = b""
            while chunk := _recv_or_empty(tls):
                data += chunk
            assert data.startswith(b"HTTP/1.1 408"), data[:200]
            assert 0.9 < time.monotonic() - started < 5
        (record,) = gw.records_until(lambda rs: any(r["reason"] == "header_timeout" for r in rs))[-1:]
        assert record["decision"] == "deny"
        assert up.connections == [], "nothing reached the upstream"


def _recv_or_empty(tls: ssl.SSLSocket) -> bytes:
    try:
        return tls.recv(65536)
    except (TimeoutError, ConnectionError, ssl.SSLError):
        return b""


def test_the_environment_names_the_path_when_the_config_does_not(
    start_gateway: GatewayFactory, pki: TestPKI
) -> None:
    with RecordingUpstream(UPSTREAM_IP, tls=pki, name="lean-env") as up:
        served = {}
        for path in PATHS:
            gw = start_gateway(
                {"t1.yaml": _tenant(up.port)},
                env={"SANDGATE_TEST_LEAN_SECRET": REAL, "SANDGATE_HTTP1_PATH": path},
            )
            with tls_tunnel(gw, up.port) as tls:
                tls.sendall(b"GET /env HTTP/1.1\r\nHost: api.test\r\n\r\n")
                response, _ = _read_response(tls)
            assert response.startswith(b"HTTP/1.1 200")
            served[path] = lean_counters(gw)["sandgate_http1_lean_exchanges_total"]
        assert served == {"general": 0, "lean": 1}
        bad = start_gateway(
            {"t1.yaml": _tenant(up.port)}, env={"SANDGATE_HTTP1_PATH": "fast"}, expect_exit=True
        )
        assert bad.proc.returncode != 0
        assert "SANDGATE_HTTP1_PATH" in bad.log() and "'fast'" in bad.log()


assert TOKEN  # the tunnels authenticate as conftest's sb1 (support.tunnels.TOKEN)
