"""Protocol switches: no `Upgrade` or `101` turns a connection into an unchecked byte pipe.

End to end through a real gateway to real upstreams on loopback that do switch protocols
(tests/support/switching.py), with raw sockets and wsproto as the guest.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
import yaml
from conftest import SANDGATE, TOKEN, TOKEN_REF, UPSTREAM_IP, GatewayFactory, RunningGateway
from support import TestPKI
from support.switching import SwitchingUpstream
from support.ws_peers import WebSocketGuest, WebSocketUpstream
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Event, Ping, Pong, Request, TextMessage
from wsproto.frame_protocol import CloseReason

pytestmark = pytest.mark.slow

REAL = "sk-upgrade-test-0123456789abcdef0123456789"
AUTH = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()


def _tenant(port: int, *, websocket: bool = False, credentials: bool = False) -> str:
    rule: dict[str, Any] = {"id": "api", "hosts": ["api.test"], "ports": [port], "inspect": True}
    if websocket:
        rule["websocket"] = True
    doc: dict[str, Any] = {
        "tenant": "t1",
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
        "allow": [rule],
        "deny": [{"id": "no-admin", "hosts": ["api.test"], "paths": ["/admin/**"]}],
    }
    if credentials:
        doc["credentials"] = [
            {
                "name": "api",
                "secret": "env:SANDGATE_UPGRADE_SECRET",
                "hosts": ["api.test"],
                "ports": [port],
                "env": "API_KEY",
                "inject": {"header": "Authorization", "format": "Bearer {secret}"},
            }
        ]
    return yaml.safe_dump(doc, sort_keys=False)


def _placeholder(gw: RunningGateway) -> str:
    out = subprocess.run(
        [SANDGATE, "credentials", "placeholders", "--sandbox", "sb1", "--format", "json"]
        + ["--config", str(gw.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout)["API_KEY"])


def _intercepted(gw: RunningGateway, port: int) -> ssl.SSLSocket:
    """A TLS connection to api.test:`port` through the gateway (intercepted with its CA)."""
    raw = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    raw.sendall(
        f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n"
        f"Proxy-Authorization: Basic {AUTH}\r\n\r\n".encode()
    )
    assert raw.recv(4096).startswith(b"HTTP/1.1 200")
    ctx = ssl.create_default_context(cafile=str(gw.ca_file))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx.wrap_socket(raw, server_hostname="api.test")


def _read_all(sock: socket.socket, timeout: float = 10) -> tuple[bytes, bool]:
    """Everything until the peer closes; (data, closed) where closed says EOF came in time."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data, False
    except (ConnectionResetError, ssl.SSLError):
        pass
    return data, True


def _response(sock: socket.socket) -> bytes:
    """One whole response (head and Content-Length body) from a keep-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {data!r}"
        data += chunk
    length = int(_head(data)[1].get("content-length", "0"))
    while len(data.partition(b"\r\n\r\n")[2]) < length:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {data!r}"
        data += chunk
    return data


def _head(data: bytes) -> tuple[int, dict[str, str]]:
    lines = data.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split(" ")[1]), headers


def assert_clean_log(gw: RunningGateway) -> None:
    """A refusal is not a crash: no traceback, no mitmproxy crash report."""
    time.sleep(0.5)  # what the teardown of the closed connections logs
    log = gw.log()
    assert "Traceback" not in log and "crashed" not in log and '"level": "error"' not in log, log[-3000:]


@pytest.fixture
def always_switching(pki: TestPKI) -> Iterator[SwitchingUpstream]:
    with SwitchingUpstream(UPSTREAM_IP, "always", tls=pki) as up:
        yield up


def test_an_unapproved_101_closes_both_sides_and_nothing_after_it_reaches_the_upstream(
    start_gateway: GatewayFactory, always_switching: SwitchingUpstream
) -> None:
    up = always_switching
    gw = start_gateway({"t1.yaml": _tenant(up.port)})
    tls = _intercepted(gw, up.port)
    # An allowed request the upstream answers with 101, and right behind it (pipelined) a
    # request the policy denies: after a switch it would be raw bytes in a pipe.
    host = f"api.test:{up.port}"
    tls.sendall(
        f"GET /start HTTP/1.1\r\nHost: {host}\r\n\r\n"
        f"DELETE /admin/users HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n".encode()
    )
    data, client_closed = _read_all(tls)
    status, headers = _head(data)
    assert status == 403 and headers["x-sandgate-reason"] == "upgrade_not_allowed"
    assert client_closed, "the guest's connection is closed after the refusal"
    assert up.wait_closed(0), "the upstream connection is closed too"
    assert up.after_switch.get(0, b"") == b"", "nothing passed the refused switch"
    decision_id = json.loads(data.partition(b"\r\n\r\n")[2])["decision_id"]
    record = gw.record(decision_id)
    assert (record["phase"], record["decision"], record["reason"]) == (
        "request",
        "deny",
        "upgrade_not_allowed",
    )
    # Nothing for the pipelined DELETE, however late: read once the trail is still.
    assert [r["reason"] for r in gw.settled() if r["phase"] == "request"] == ["upgrade_not_allowed"]
    assert_clean_log(gw)
    with contextlib.suppress(OSError):
        tls.close()


@pytest.mark.parametrize("mode", ["always", "h2c"], ids=["a bare 101", "a 101 with HTTP/2 behind it"])
def test_a_101_to_a_stripped_h2c_offer_in_a_tunnel_is_denied_as_upgrade_not_allowed(
    start_gateway: GatewayFactory, pki: TestPKI, mode: Any
) -> None:
    # The h2c offer is stripped; the upstream switches anyway: a refused switch, not an
    # upstream failure, and never `allow`.
    with SwitchingUpstream(UPSTREAM_IP, mode, tls=pki) as up:
        _refused_h2c_switch(start_gateway, up)


def _refused_h2c_switch(start_gateway: GatewayFactory, up: SwitchingUpstream) -> None:
    gw = start_gateway({"t1.yaml": _tenant(up.port)})
    tls = _intercepted(gw, up.port)
    tls.sendall(
        f"GET /h2c HTTP/1.1\r\nHost: api.test:{up.port}\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n".encode()
    )
    data, client_closed = _read_all(tls)
    status, headers = _head(data)
    assert (status, headers.get("x-sandgate-reason")) == (403, "upgrade_not_allowed"), data[:300]
    assert client_closed and up.wait_closed(0)
    assert up.after_switch.get(0, b"") == b""
    (record,) = [r for r in gw.settled() if r["phase"] == "request"]
    assert (record["decision"], record["reason"], record["status"]) == ("deny", "upgrade_not_allowed", 403)
    assert_clean_log(gw)
    with contextlib.suppress(OSError):
        tls.close()


def test_an_h2c_offer_is_stripped_so_every_later_request_is_still_decided(
    start_gateway: GatewayFactory,
) -> None:
    with SwitchingUpstream(UPSTREAM_IP, "honour") as up:
        gw = start_gateway({"t1.yaml": _tenant(up.port)})
        base = f"http://api.test:{up.port}"
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            sock.sendall(
                f"GET {base}/first HTTP/1.1\r\nHost: api.test:{up.port}\r\n"
                f"Proxy-Authorization: Basic {AUTH}\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n".encode()
            )
            first = _response(sock)
            assert _head(first)[0] == 200, first
            sock.sendall(
                f"DELETE {base}/admin/users HTTP/1.1\r\nHost: api.test:{up.port}\r\n"
                f"Proxy-Authorization: Basic {AUTH}\r\nContent-Length: 0\r\n\r\n".encode()
            )
            second = _response(sock)
        assert (
            _head(second) == (403, _head(second)[1])
            and _head(second)[1]["x-sandgate-reason"] == "host_denied"
        )
        (head,) = up.heads
        lowered = head.lower()
        assert b"upgrade" not in lowered and b"http2-settings" not in lowered, head


@pytest.mark.parametrize(
    ("upgrade", "extra"),
    [
        ("foo/1", ""),
        ("h2c, foo", ""),
        ("websocket", "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"),
    ],
    ids=["a protocol no rule can allow", "h2c offered with another", "WebSocket without a websocket rule"],
)
def test_upgrades_no_rule_allows_are_refused_before_the_upstream_sees_them(
    start_gateway: GatewayFactory, pki: TestPKI, upgrade: str, extra: str
) -> None:
    with SwitchingUpstream(UPSTREAM_IP, "honour", tls=pki) as up:
        gw = start_gateway({"t1.yaml": _tenant(up.port)})
        tls = _intercepted(gw, up.port)
        tls.sendall(
            f"GET /ws HTTP/1.1\r\nHost: api.test:{up.port}\r\nConnection: Upgrade\r\n"
            f"Upgrade: {upgrade}\r\n{extra}\r\n".encode()
        )
        data = tls.recv(65536)
        tls.close()
        status, headers = _head(data)
        assert status == 403 and headers["x-sandgate-reason"] == "upgrade_not_allowed"
        record = gw.record(headers["x-sandgate-decision-id"])
        assert (record["decision"], record["rule_id"]) == ("deny", "t1/allow/api")
        assert up.heads == []


def _websocket(gw: RunningGateway, port: int, placeholder: str) -> tuple[ssl.SSLSocket, WSConnection]:
    tls = _intercepted(gw, port)
    ws = WSConnection(ConnectionType.CLIENT)
    tls.sendall(
        ws.send(
            Request(
                host=f"api.test:{port}",
                target="/ws",
                extra_headers=[(b"authorization", f"Bearer {placeholder}".encode())],
            )
        )
    )
    ws.receive_data(tls.recv(65536))
    assert any(isinstance(e, AcceptConnection) for e in ws.events())
    return tls, ws


def _texts(tls: ssl.SSLSocket, ws: WSConnection) -> list[str]:
    ws.receive_data(tls.recv(65536))
    return [e.data for e in ws.events() if isinstance(e, TextMessage)]


def test_a_websocket_passes_where_a_rule_allows_it_and_a_placeholder_in_a_message_closes_it(
    start_gateway: GatewayFactory, pki: TestPKI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDGATE_UPGRADE_SECRET", REAL)
    with SwitchingUpstream(UPSTREAM_IP, "websocket", tls=pki) as up:
        gw = start_gateway({"t1.yaml": _tenant(up.port, websocket=True, credentials=True)})
        ph = _placeholder(gw)
        tls, ws = _websocket(gw, up.port, ph)
        tls.sendall(ws.send(TextMessage(data="hello")))
        assert _texts(tls, ws) == ["echo: hello"]
        records = gw.records_until(lambda rs: any(r.get("status") == 101 for r in rs))
        (handshake,) = [r for r in records if r.get("status") == 101]
        assert (handshake["decision"], handshake["status"], handshake["rule_id"]) == (
            "allow",
            101,
            "t1/allow/api",
        )
        assert f"Bearer {REAL}".encode() in up.heads[0], "the handshake got the real credential"
        # A placeholder inside a message is never forwarded: the session is closed on both sides.
        tls.sendall(ws.send(TextMessage(data=json.dumps({"token": ph}))))
        rest, closed = _read_all(tls)
        assert closed and ph.encode() not in rest
        assert up.wait_closed(0)
        assert up.messages == ["hello"]
        # Other records (the tunnel's, completed when it closes) may come before or after it.
        records = gw.records_until(lambda rs: any(r["decision"] == "deny" for r in rs))
        denials = [r for r in records if r["decision"] == "deny"]
        assert denials, "the closed session has its denial record"
        (denial,) = denials
        assert (denial["reason"], denial["detail"]) == (
            "credential_host_mismatch",
            "a placeholder in a WebSocket message",
        )
        assert denial["decision_id"] != handshake["decision_id"]
        assert REAL not in gw.audit_path.read_text() + gw.log()
        assert_clean_log(gw)
        tls.close()


def test_websocket_messages_count_against_the_egress_limit(
    start_gateway: GatewayFactory, pki: TestPKI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDGATE_UPGRADE_SECRET", REAL)
    with SwitchingUpstream(UPSTREAM_IP, "websocket", tls=pki) as up:
        doc = yaml.safe_load(_tenant(up.port, websocket=True, credentials=True))
        doc["limits"] = {"egress_bytes_per_hour": 2000}
        gw = start_gateway({"t1.yaml": yaml.safe_dump(doc)})
        tls, ws = _websocket(gw, up.port, _placeholder(gw))
        tls.sendall(ws.send(TextMessage(data="a" * 100)))
        assert _texts(tls, ws) == ["echo: " + "a" * 100]
        tls.sendall(ws.send(TextMessage(data="b" * 5000)))
        _, closed = _read_all(tls)
        assert closed and up.wait_closed(0)
        assert up.messages == ["a" * 100]
        # The tunnel's record (completed when it closes) may come before or after the denial.
        records = gw.records_until(lambda rs: any(r["reason"] == "rate_limited" for r in rs))
        assert any(r["reason"] == "rate_limited" for r in records), records
        assert_clean_log(gw)
        tls.close()


def test_an_http2_preface_on_plaintext_is_no_way_around_the_gate(start_gateway: GatewayFactory) -> None:
    with SwitchingUpstream(UPSTREAM_IP, "always") as up:
        gw = start_gateway({"t1.yaml": _tenant(up.port)})
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            sock.sendall(
                f"CONNECT api.test:{up.port} HTTP/1.1\r\nHost: api.test:{up.port}\r\n"
                f"Proxy-Authorization: Basic {AUTH}\r\n\r\n".encode()
            )
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            data, _ = _read_all(sock)
        # The preface parses as a request without a Host: denied like any other.
        status, headers = _head(data)
        assert (status, headers["x-sandgate-reason"]) == (403, "host_mismatch")
        assert up.connections == 0


def test_http2_connect_and_extended_connect_never_reach_the_upstream(
    start_gateway: GatewayFactory, pki: TestPKI
) -> None:
    with SwitchingUpstream(UPSTREAM_IP, "always", tls=pki) as up:
        gw = start_gateway({"t1.yaml": _tenant(up.port, websocket=True)})
        raw = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
        raw.sendall(
            f"CONNECT api.test:{up.port} HTTP/1.1\r\nHost: api.test:{up.port}\r\n"
            f"Proxy-Authorization: Basic {AUTH}\r\n\r\n".encode()
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
        ctx = ssl.create_default_context(cafile=str(gw.ca_file))
        ctx.set_alpn_protocols(["h2"])
        with ctx.wrap_socket(raw, server_hostname="api.test") as tls:
            assert tls.selected_alpn_protocol() == "h2"
            conn = h2.connection.H2Connection(
                h2.config.H2Configuration(client_side=True, validate_outbound_headers=False)
            )
            conn.initiate_connection()
            authority = f"api.test:{up.port}"
            # RFC 8441 (a WebSocket over HTTP/2), and a classic HTTP/2 CONNECT tunnel.
            conn.send_headers(
                1,
                [
                    (":method", "CONNECT"),
                    (":protocol", "websocket"),
                    (":scheme", "https"),
                    (":path", "/ws"),
                    (":authority", authority),
                ],
            )
            conn.send_headers(3, [(":method", "CONNECT"), (":authority", authority)])
            tls.sendall(conn.data_to_send())
            ended: set[int] = set()
            deadline = time.monotonic() + 10
            while ended != {1, 3} and time.monotonic() < deadline:
                data = tls.recv(65536)
                if not data:
                    break
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.StreamReset | h2.events.StreamEnded):
                        ended.add(event.stream_id)
                    if isinstance(event, h2.events.ConnectionTerminated):
                        ended |= {1, 3}
                tls.sendall(conn.data_to_send())
        assert ended == {1, 3}
        assert up.connections == 0 and up.heads == []


# -- control frames: PING and PONG payloads, CLOSE reasons -------------------------------------


@pytest.fixture(scope="module")
def ws_upstream(pki: TestPKI) -> Iterator[WebSocketUpstream]:
    with WebSocketUpstream(UPSTREAM_IP, pki) as up:
        yield up


@pytest.fixture(scope="module")
def control_gateway(
    start_module_gateway: GatewayFactory, ws_upstream: WebSocketUpstream
) -> tuple[RunningGateway, str]:
    """A gateway whose tenant holds a credential bound to the WebSocket upstream; its placeholder."""
    gw = start_module_gateway(
        {"t1.yaml": _tenant(ws_upstream.port, websocket=True, credentials=True)},
        env={"SANDGATE_UPGRADE_SECRET": REAL},
    )
    return gw, _placeholder(gw)


def _control_guest(gw: RunningGateway, up: WebSocketUpstream, placeholder: str) -> WebSocketGuest:
    """A WebSocket whose handshake carries the credential: the broker scrubs the session."""
    auth = (b"authorization", f"Bearer {placeholder}".encode())
    return WebSocketGuest(gw.port, gw.ca_file, "api.test", up.port, ("sb1", TOKEN), headers=[auth])


def _named_record(gw: RunningGateway, close_reason: str | None) -> dict[str, Any]:
    """The record a CLOSE's reason names (`sandgate: <reason> (decision <id>)`)."""
    found = re.fullmatch(r"sandgate: (\w+) \(decision ([0-9a-f]+)\)", close_reason or "")
    assert found, close_reason
    record = gw.record(found.group(2))
    assert record["reason"] == found.group(1)
    return record


def _b64(text: str) -> bytes:
    return base64.b64encode(text.encode())


@pytest.mark.parametrize(
    ("frame", "what"),
    [
        (lambda ph: Ping(ph.encode()), "ping"),
        (lambda ph: Pong(ph.encode()), "pong"),
        (lambda ph: CloseConnection(1000, f"bye {ph}"), "close reason"),
        (lambda ph: Ping(b"x=" + _b64(ph)), "ping"),
    ],
    ids=[
        "a placeholder in a PING payload",
        "a placeholder in a PONG payload",
        "a placeholder in a CLOSE reason",
        "a base64-encoded placeholder in a PING payload",
    ],
)
def test_a_placeholder_in_a_guest_control_frame_closes_the_session_and_never_reaches_the_upstream(
    control_gateway: tuple[RunningGateway, str],
    ws_upstream: WebSocketUpstream,
    frame: Callable[[str], Event],
    what: str,
) -> None:
    gw, ph = control_gateway
    gw.mark()
    conn_id = len(ws_upstream.events)
    guest = _control_guest(gw, ws_upstream, ph)
    try:
        # An ordinary PING goes through, and its PONG comes back.
        guest.send(Ping(b"hello"))
        assert guest.wait(lambda evs: any(isinstance(e, Pong) and e.payload == b"hello" for e in evs))
        guest.send(frame(ph))
        close = guest.close_event()
    finally:
        guest.close()
    assert close is not None and close.code == CloseReason.POLICY_VIOLATION, close
    upstream = ws_upstream.wait_for(conn_id, "eof")
    assert upstream[0] == ("ping", b"hello")
    assert ("close", CloseReason.GOING_AWAY, "") in upstream, upstream
    seen = ws_upstream.all_bytes() + b"".join(ws_upstream.heads)
    assert ph.encode() not in seen and _b64(ph) not in seen, "the placeholder reached the upstream"
    record = _named_record(gw, close.reason)
    assert (record["decision"], record["reason"], record["detail"]) == (
        "deny",
        "credential_host_mismatch",
        f"a placeholder in a WebSocket {what}",
    )
    assert [r["decision_id"] for r in gw.settled() if r["decision"] == "deny"] == [record["decision_id"]]
    assert REAL not in gw.audit_path.read_text() + gw.log()
    assert_clean_log(gw)


@pytest.mark.parametrize(
    "cue",
    ["pong-me", "close-me", "ping-me"],
    ids=[
        "a PONG carrying the secret arrives with the placeholder",
        "a CLOSE reason carrying the secret arrives with the placeholder",
        "a PING carrying the secret (the guest would echo it) ends the session",
    ],
)
def test_upstream_control_frames_never_bring_the_real_secret_to_the_guest(
    control_gateway: tuple[RunningGateway, str], ws_upstream: WebSocketUpstream, cue: str
) -> None:
    gw, ph = control_gateway
    gw.mark()
    conn_id = len(ws_upstream.events)
    guest = _control_guest(gw, ws_upstream, ph)
    try:
        assert f"Bearer {REAL}".encode() in ws_upstream.heads[-1], "the handshake got the real credential"
        if cue == "close-me":
            guest.send(TextMessage(f"close-me:1000:bye {REAL}"))
        else:
            guest.send(TextMessage(f"{cue}:{REAL.encode().hex()}"))
        if cue == "pong-me":
            assert guest.wait(lambda evs: any(isinstance(e, Pong) for e in evs))
            (pong,) = [e for e in guest.events if isinstance(e, Pong)]
            assert pong.payload == ph.encode()
            guest.send(TextMessage("still open"))
            assert guest.wait(lambda evs: any(isinstance(e, TextMessage) for e in evs))
        close = guest.close_event(timeout=2 if cue == "pong-me" else 10)
    finally:
        guest.close()
    assert REAL.encode() not in guest.received, "the real secret reached the guest"
    if cue == "close-me":
        assert close is not None and (close.code, close.reason) == (1000, f"bye {ph}")
    elif cue == "ping-me":
        assert close is not None and close.code == CloseReason.INTERNAL_ERROR, close
        assert not any(isinstance(e, Ping) for e in guest.events)
        upstream = ws_upstream.wait_for(conn_id, "eof")
        assert ("close", CloseReason.POLICY_VIOLATION, "") in upstream, upstream
    assert REAL not in gw.audit_path.read_text() + gw.log()
    assert_clean_log(gw)
