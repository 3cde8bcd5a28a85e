"""Credential brokering end to end: real gateway, real upstreams that record what they got."""

from __future__ import annotations

import base64
import gzip
import json
import os
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import yaml
from conftest import OTHER_TOKEN, OTHER_TOKEN_REF, TOKEN, TOKEN_REF, GatewayFactory, RunningGateway
from support import RecordingUpstream

from sandgate.brokers import PlaceholderMinter, Secret

pytestmark = pytest.mark.slow

REAL = "sk-live-REALSECRET-0123456789abcdef"
FILE_SECRET = "filekey-REAL-abcdefghijklmnop-1"
OTHER_REAL = "other-tenant-REAL-secret-000111"


def tenant(
    name: str, sandbox: str, token_ref: str, rules: list[dict[str, Any]], creds: list[dict[str, Any]]
) -> str:
    return yaml.safe_dump(
        {
            "tenant": name,
            "sandboxes": [{"id": sandbox, "token": token_ref}],
            "allow": rules,
            "credentials": creds,
        },
        sort_keys=False,
    )


def start_brokering(
    start: GatewayFactory, https_upstream: RecordingUpstream, http_upstream: RecordingUpstream
) -> RunningGateway:
    """A gateway with two tenants: t1 holds an env, a file and a broken credential, t2 one of its own."""
    tls, plain = https_upstream.port, http_upstream.port
    rules = [
        {"hosts": ["api.test", "open.test"], "ports": [tls], "inspect": True},
        {"hosts": ["api.test"], "ports": [plain]},
    ]
    creds = [
        {
            "name": "openai",
            "secret": "env:SANDGATE_TEST_SECRET",
            "hosts": ["api.test"],
            "ports": [tls],
            "env": "OPENAI_API_KEY",
            "inject": {"header": "Authorization", "format": "Bearer {secret}"},
        },
        {
            "name": "filekey",
            "secret": "file:filekey.secret",
            "hosts": ["api.test"],
            "ports": [tls],
            "inject": {"query": "api_key"},
        },
        {
            "name": "broken",
            "secret": "env:SANDGATE_TEST_MISSING",
            "hosts": ["api.test"],
            "ports": [tls],
            "inject": {"header": "X-Broken-Key"},
        },
    ]
    other = [
        {
            "name": "theirs",
            "secret": "env:SANDGATE_TEST_OTHER",
            "hosts": ["api.test"],
            "ports": [tls],
            "inject": {"header": "X-Their-Key"},
        }
    ]
    return start(
        {
            "t1.yaml": tenant("t1", "sb1", TOKEN_REF, rules, creds),
            "t2.yaml": tenant("t2", "sb2", OTHER_TOKEN_REF, rules, other),
        },
        prepare=lambda root: _write_secret(root / "rules" / "tenants" / "filekey.secret", FILE_SECRET),
        env={"SANDGATE_TEST_SECRET": REAL, "SANDGATE_TEST_OTHER": OTHER_REAL},
    )


@pytest.fixture(scope="module")
def shared_gateway(
    start_module_gateway: GatewayFactory, https_upstream: RecordingUpstream, http_upstream: RecordingUpstream
) -> RunningGateway:
    return start_brokering(start_module_gateway, https_upstream, http_upstream)


@pytest.fixture
def gateway(shared_gateway: RunningGateway) -> RunningGateway:
    """The module's brokering gateway, for a test that changes nothing in it."""
    shared_gateway.mark()
    return shared_gateway


@pytest.fixture
def own_gateway(
    start_gateway: GatewayFactory, https_upstream: RecordingUpstream, http_upstream: RecordingUpstream
) -> RunningGateway:
    """A brokering gateway of the test's own, for a test that changes its files."""
    return start_brokering(start_gateway, https_upstream, http_upstream)


def _write_secret(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")


_PLACEHOLDERS: dict[tuple[Path, str], dict[str, str]] = {}


def placeholders(gw: RunningGateway, sandbox: str) -> dict[str, str]:
    """The sandbox's placeholders, as `sandgate credentials placeholders` lists them; asked once
    per gateway and sandbox (a CLI run takes a second or two; a gateway's placeholders stay)."""
    key = (gw.root, sandbox)
    if key not in _PLACEHOLDERS:
        _PLACEHOLDERS[key] = gw.placeholders(sandbox)
    return dict(_PLACEHOLDERS[key])


def client(gw: RunningGateway, sandbox: str = "sb1", token: str = TOKEN, timeout: float = 10) -> httpx.Client:
    return httpx.Client(
        proxy=gw.proxy(sandbox, token),
        verify=ssl.create_default_context(cafile=str(gw.ca_file)),
        timeout=timeout,
    )


def assert_no_secret_anywhere(gw: RunningGateway, *texts: str) -> None:
    haystacks = [gw.audit_path.read_text(), gw.log(), *texts]
    for secret in (REAL, FILE_SECRET, OTHER_REAL):
        assert not any(secret in h for h in haystacks), "a real secret leaked to the guest, audit or logs"


def test_the_placeholder_becomes_the_real_key_only_at_the_bound_host(
    gateway: RunningGateway, https_upstream: RecordingUpstream
) -> None:
    injected_before = injections(gateway)
    ph = placeholders(gateway, "sb1")
    assert set(ph) == {"OPENAI_API_KEY", "SANDGATE_FILEKEY", "SANDGATE_BROKEN"}
    assert all(v.startswith("sgph_") for v in ph.values())
    with client(gateway) as c:
        resp = c.get(
            f"{https_upstream.url_for('api.test')}/v1/models",
            headers={"Authorization": f"Bearer {ph['OPENAI_API_KEY']}"},
        )
    assert resp.status_code == 200
    (req,) = https_upstream.requests
    assert req.header("Authorization") == f"Bearer {REAL}"
    echoed = resp.text
    assert ph["OPENAI_API_KEY"] in echoed, "the echoed header comes back as the placeholder"
    (record,) = [r for r in gateway.records(3) if r["path"] == "/v1/models"]
    assert (record["credentials"], record["injectors"]) == (["openai"], ["header"])
    assert_no_secret_anywhere(gateway, echoed)
    assert injections(gateway) == injected_before + 1


def injections(gw: RunningGateway) -> float:
    """The gateway's count of `openai` injections for t1, from its metrics."""
    admin = httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock"))
    with httpx.Client(transport=admin, base_url="http://sandgate") as c:
        metrics = c.get("/metrics").text
    name = 'sandgate_credential_injections_total{credential="openai",tenant="t1"} '
    return sum(float(line.removeprefix(name)) for line in metrics.splitlines() if line.startswith(name))


def test_a_query_credential_is_injected_and_scrubbed_from_the_echo(
    gateway: RunningGateway, https_upstream: RecordingUpstream
) -> None:
    ph = placeholders(gateway, "sb1")["SANDGATE_FILEKEY"]
    with client(gateway) as c:
        resp = c.get(f"{https_upstream.url_for('api.test')}/search?q=x&api_key={ph}")
    assert resp.status_code == 200
    assert https_upstream.requests[0].target == f"/search?q=x&api_key={FILE_SECRET}"
    assert json.loads(resp.text)["path"] == f"/search?q=x&api_key={ph}"
    assert_no_secret_anywhere(gateway, resp.text)


def test_a_rotated_file_secret_is_used_on_the_next_request(
    own_gateway: RunningGateway, https_upstream: RecordingUpstream
) -> None:
    ph = placeholders(own_gateway, "sb1")["SANDGATE_FILEKEY"]
    url = f"{https_upstream.url_for('api.test')}/r?api_key={ph}"
    with client(own_gateway) as c:
        c.get(url)
        _write_secret(own_gateway.rules_dir / "tenants" / "filekey.secret", "filekey-ROTATED-abcdefghijklmn")
        c.get(url)
    assert [r.target.split("api_key=")[1] for r in https_upstream.requests] == [
        FILE_SECRET,
        "filekey-ROTATED-abcdefghijklmn",
    ]


@pytest.mark.parametrize(
    "where",
    ["header", "query", "json body", "base64 basic auth", "percent-encoded query", "lower-cased header"],
    ids=lambda w: f"a placeholder in a {w} to an unbound host is refused",
)
def test_exfiltration_to_an_unbound_host_is_refused(
    gateway: RunningGateway, https_upstream: RecordingUpstream, where: str
) -> None:
    ph = placeholders(gateway, "sb1")["OPENAI_API_KEY"]
    url = f"{https_upstream.url_for('open.test')}/collect"
    kwargs: dict[str, Any] = {}
    if where == "header":
        kwargs["headers"] = {"X-Stolen": ph}
    elif where == "query":
        url += f"?k={ph}"
    elif where == "json body":
        kwargs["json"] = {"nested": {"key": ph}}
    elif where == "base64 basic auth":
        kwargs["headers"] = {"Authorization": "Basic " + base64.b64encode(f"user:{ph}".encode()).decode()}
    elif where == "percent-encoded query":
        url += "?k=" + quote(ph, safe="").replace("_", "%5F")
    elif where == "lower-cased header":
        kwargs["headers"] = {"x-stolen": ph.lower()}
    with client(gateway) as c:
        resp = c.post(url, **kwargs) if "json" in kwargs else c.get(url, **kwargs)
    assert resp.status_code == 403
    assert resp.headers["X-Sandgate-Reason"] == "credential_host_mismatch"
    assert ph not in resp.text
    assert https_upstream.requests == [], "the placeholder was never forwarded"
    record = gateway.record(resp.json()["decision_id"])
    assert record["credentials"] == ["openai"]
    assert_no_secret_anywhere(gateway)


def test_a_bound_host_on_another_port_gets_no_credential(
    gateway: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    ph = placeholders(gateway, "sb1")["OPENAI_API_KEY"]
    with client(gateway) as c:
        resp = c.get(f"{http_upstream.url_for('api.test')}/plain", headers={"Authorization": f"Bearer {ph}"})
    assert resp.status_code == 403
    assert resp.headers["X-Sandgate-Reason"] == "credential_host_mismatch"
    assert http_upstream.requests == []


def test_another_tenants_placeholder_is_refused_and_flagged(
    gateway: RunningGateway, https_upstream: RecordingUpstream
) -> None:
    theirs = placeholders(gateway, "sb2")["SANDGATE_THEIRS"]
    with client(gateway) as c:
        resp = c.get(f"{https_upstream.url_for('api.test')}/x", headers={"X-Their-Key": theirs})
    assert resp.status_code == 403
    # The same answer as for a forgery: the guest learns nothing about whose it is.
    assert resp.headers["X-Sandgate-Reason"] == "unknown_placeholder"
    record = gateway.record(resp.json()["decision_id"])
    assert record["broker"]["foreign"] is True
    assert https_upstream.requests == []
    with client(gateway, "sb2", OTHER_TOKEN) as c:
        ok = c.get(f"{https_upstream.url_for('api.test')}/x", headers={"X-Their-Key": theirs})
    assert ok.status_code == 200 and https_upstream.requests[0].header("X-Their-Key") == OTHER_REAL


# What `credentials placeholders` prints when it is run without this gateway's `--config`.
ANOTHER_KEY = PlaceholderMinter(Secret("the-placeholder-key-of-another-gateway-0123456789"))


def _unknown_request(where: str, forged: str, url: str) -> dict[str, Any]:
    if where == "authorization header":
        return {"url": url, "headers": {"Authorization": f"Bearer {forged}"}}
    if where == "upper-cased header":
        return {"url": url, "headers": {"X-Api-Key": forged.upper()}}
    if where == "query":
        return {"url": f"{url}?api_key={forged}"}
    if where == "percent-encoded path":
        return {"url": f"{url}/" + quote(forged, safe="").replace("_", "%5F")}
    if where == "json body":
        return {"url": url, "json": {"key": forged}}
    assert where == "streamed body"
    return {"url": url, "content": b"x" * (2 * 1024 * 1024) + forged.encode() + b"\n"}


@pytest.mark.parametrize(
    "where",
    [
        "authorization header",
        "upper-cased header",
        "query",
        "percent-encoded path",
        "json body",
        "streamed body",
    ],
    ids=lambda w: f"in the {w}",
)
def test_a_placeholder_this_gateway_did_not_mint_is_refused_audited_and_never_forwarded(
    gateway: RunningGateway, https_upstream: RecordingUpstream, where: str
) -> None:
    forged = ANOTHER_KEY.mint("t1", "sb1", "openai")  # the right triple, the wrong key
    args = _unknown_request(where, forged, f"{https_upstream.url_for('api.test')}/v1/echo")
    url = args.pop("url")
    with client(gateway, timeout=20) as c:
        try:
            resp: httpx.Response | None = c.post(url, **args)
        except httpx.HTTPError:
            resp = None  # a streamed body is cut: mitmproxy cannot answer it any more
    if where == "streamed body":
        assert resp is None or resp.status_code != 200

        def echoes(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [r for r in records if r["phase"] == "request" and r["path"] == "/v1/echo"]

        assert echoes(gateway.records_until(lambda rs: bool(echoes(rs)))), "no record of the streamed request"
        records = echoes(gateway.settled())  # and any second record of it has shown up
    else:
        assert resp is not None, "only a streamed body may be cut off"
        assert resp.status_code == 403, resp.text
        assert resp.headers["X-Sandgate-Reason"] == "unknown_placeholder"
        assert forged not in resp.text
        # Waits for the audit writer thread, and checks there is exactly one record of it.
        records = [gateway.record(resp.json()["decision_id"])]
    assert len(records) == 1 and records[0]["decision"] == "deny"
    assert records[0]["reason"] == "unknown_placeholder"
    assert not any(forged.encode() in r.body or forged in r.target for r in https_upstream.requests)
    if where != "streamed body":
        assert https_upstream.requests == [], "nothing reached the upstream"


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        ("gzip, gzip", lambda b: gzip.compress(gzip.compress(b))),
        ("x-gzip", gzip.compress),
        ("gzip", lambda b: _flip(gzip.compress(b), 15)),  # a damaged stream: it does not decode
    ],
    ids=["a chain of encodings", "an encoding mitmproxy does not know", "a corrupt gzip body"],
)
def test_an_echo_in_an_encoding_the_gateway_cannot_undo_never_reaches_the_guest(
    gateway: RunningGateway, https_upstream: RecordingUpstream, encoding: str, encode: Any
) -> None:
    https_upstream.body = encode(json.dumps({"echo": f"Bearer {REAL}"}).encode())
    https_upstream.extra_headers = (("Content-Encoding", encoding),)
    try:
        with client(gateway) as c:
            resp = c.get(f"{https_upstream.url_for('api.test')}/v1/echo")  # nothing injected
    finally:
        https_upstream.body, https_upstream.extra_headers = None, ()
    assert resp.status_code == 403 and resp.headers["X-Sandgate-Reason"] == "internal_error"
    raw = resp.content
    for _ in range(2):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError):
            break
    assert REAL.encode() not in raw and REAL.encode() not in resp.content
    assert_no_secret_anywhere(gateway, resp.text)


def test_an_unavailable_secret_fails_closed(
    gateway: RunningGateway, https_upstream: RecordingUpstream
) -> None:
    ph = placeholders(gateway, "sb1")["SANDGATE_BROKEN"]
    with client(gateway) as c:
        resp = c.get(f"{https_upstream.url_for('api.test')}/x", headers={"X-Broken-Key": ph})
    assert resp.status_code == 403
    assert resp.headers["X-Sandgate-Reason"] == "internal_error"
    assert https_upstream.requests == []


def test_a_placeholder_at_the_end_of_a_streamed_body_never_reaches_an_unbound_host(
    gateway: RunningGateway, https_upstream: RecordingUpstream
) -> None:
    ph = placeholders(gateway, "sb1")["OPENAI_API_KEY"]
    body = b"x" * (3 * 1024 * 1024) + ph.encode()  # larger than the buffered limit: streamed
    with client(gateway, timeout=3) as c:
        try:
            resp = c.post(f"{https_upstream.url_for('open.test')}/upload", content=body)
            status = resp.status_code
        except httpx.HTTPError:
            status = None  # the gateway cut the stream
    assert status != 200
    assert not any(ph.encode() in r.body for r in https_upstream.requests)


class _EchoWithoutLength:
    """An HTTPS server that echoes the Authorization header inside a 2 MiB body and ends the
    body by closing (no Content-Length): the body mitmproxy would start streaming mid-way."""

    def __init__(self, pki: Any, gzip_body: bool) -> None:
        import socket
        import threading

        self.gzip_body = gzip_body
        self.ctx = pki.server_context()
        self.sock = socket.create_server(("127.0.0.2", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import gzip

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                with self.ctx.wrap_socket(conn, server_side=True) as tls:
                    head = b""
                    while b"\r\n\r\n" not in head:
                        head += tls.recv(4096)
                    auth = next(
                        (
                            line.split(b":", 1)[1].strip()
                            for line in head.split(b"\r\n")
                            if line.lower().startswith(b"authorization:")
                        ),
                        b"",
                    )
                    body = (b"x" * 1_000_000 + b"AUTH=" + auth + b"\n") * 2
                    extra = b""
                    if self.gzip_body:
                        body, extra = gzip.compress(body), b"Content-Encoding: gzip\r\n"
                    tls.sendall(b"HTTP/1.1 200 OK\r\n" + extra + b"Connection: close\r\n\r\n" + body)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize(
    "gzip_body",
    [False, True],
    ids=[
        "a large echo without length is scrubbed while streaming",
        "a large compressed echo is decoded and scrubbed while streaming",
    ],
)
def test_large_echoes_never_carry_the_secret_back(
    start_gateway: GatewayFactory, pki: Any, monkeypatch: pytest.MonkeyPatch, gzip_body: bool
) -> None:
    monkeypatch.setenv("SANDGATE_TEST_SECRET", REAL)
    echo = _EchoWithoutLength(pki, gzip_body)
    try:
        creds = [
            {
                "name": "openai",
                "secret": "env:SANDGATE_TEST_SECRET",
                "hosts": ["api.test"],
                "ports": [echo.port],
                "env": "OPENAI_API_KEY",
                "inject": {"header": "Authorization", "format": "Bearer {secret}"},
            }
        ]
        rules = [{"hosts": ["api.test"], "ports": [echo.port], "inspect": True}]
        gw = start_gateway({"t1.yaml": tenant("t1", "sb1", TOKEN_REF, rules, creds)})
        ph = placeholders(gw, "sb1")["OPENAI_API_KEY"]
        received = b""
        with client(gw, timeout=15) as c:
            try:
                with c.stream(
                    "GET", f"https://api.test:{echo.port}/echo", headers={"Authorization": f"Bearer {ph}"}
                ) as r:
                    for chunk in r.iter_bytes():
                        received += chunk
            except httpx.HTTPError:
                pass  # cut off: what arrived so far is still checked (and found short below)
        assert REAL.encode() not in received
        assert received.count(f"AUTH=Bearer {ph}".encode()) == 2
    finally:
        echo.close()


class _WebSocketEcho:
    """An HTTPS WebSocket server that sends the Authorization header it got back as a message."""

    def __init__(self, pki: Any) -> None:
        import socket
        import threading

        self.ctx = pki.server_context()
        self.sock = socket.create_server(("127.0.0.2", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        from wsproto import ConnectionType, WSConnection
        from wsproto.events import AcceptConnection, Request, TextMessage

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                with self.ctx.wrap_socket(conn, server_side=True) as tls:
                    ws = WSConnection(ConnectionType.SERVER)
                    ws.receive_data(tls.recv(65536))
                    for event in ws.events():
                        if isinstance(event, Request):
                            auth = next(
                                (v for k, v in event.extra_headers if k.lower() == b"authorization"), b""
                            )
                            tls.sendall(ws.send(AcceptConnection()))
                            tls.sendall(ws.send(TextMessage(data="you sent: " + auth.decode())))
                    tls.recv(65536)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


def test_websocket_messages_from_a_bound_host_are_scrubbed(
    start_gateway: GatewayFactory, pki: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from wsproto import ConnectionType, WSConnection
    from wsproto.events import Request, TextMessage

    monkeypatch.setenv("SANDGATE_TEST_SECRET", REAL)
    server = _WebSocketEcho(pki)
    try:
        creds = [
            {
                "name": "openai",
                "secret": "env:SANDGATE_TEST_SECRET",
                "hosts": ["api.test"],
                "ports": [server.port],
                "env": "OPENAI_API_KEY",
                "inject": {"header": "Authorization", "format": "Bearer {secret}"},
            }
        ]
        gw = start_gateway(
            {
                "t1.yaml": tenant(
                    "t1",
                    "sb1",
                    TOKEN_REF,
                    [{"hosts": ["api.test"], "ports": [server.port], "websocket": True}],
                    creds,
                )
            }
        )
        ph = placeholders(gw, "sb1")["OPENAI_API_KEY"]
        auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
        raw = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
        raw.sendall(
            f"CONNECT api.test:{server.port} HTTP/1.1\r\nHost: api.test\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        assert b" 200 " in raw.recv(4096)
        tls = ssl.create_default_context(cafile=str(gw.ca_file)).wrap_socket(raw, server_hostname="api.test")
        ws = WSConnection(ConnectionType.CLIENT)
        tls.sendall(
            ws.send(
                Request(
                    host=f"api.test:{server.port}",
                    target="/ws",
                    extra_headers=[(b"authorization", f"Bearer {ph}".encode())],
                )
            )
        )
        texts: list[str] = []
        while not texts:
            data = tls.recv(65536)
            assert data, "the connection closed before a message arrived"
            ws.receive_data(data)
            texts += [e.data for e in ws.events() if isinstance(e, TextMessage)]
        tls.close()
    finally:
        server.close()
    assert texts == [f"you sent: Bearer {ph}"], "the server saw the real key; the guest sees the placeholder"
    assert_no_secret_anywhere(gw)


def _h2_get(gw: RunningGateway, port: int) -> tuple[list[tuple[str, str]], bytes, list[tuple[str, str]]]:
    """One HTTP/2 GET to api.test through an intercepted tunnel: (headers, body, trailers)."""
    import socket

    import h2.config
    import h2.connection
    import h2.events

    raw = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    raw.sendall(
        f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
    )
    assert b" 200 " in raw.recv(4096)
    tls = ssl.create_default_context(cafile=str(gw.ca_file))
    tls.set_alpn_protocols(["h2"])
    conn = tls.wrap_socket(raw, server_hostname="api.test")
    assert conn.selected_alpn_protocol() == "h2"
    h2c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    h2c.initiate_connection()
    h2c.send_headers(
        1,
        [(":method", "GET"), (":scheme", "https"), (":authority", f"api.test:{port}"), (":path", "/rpc")],
        end_stream=True,
    )
    conn.sendall(h2c.data_to_send())
    headers: list[tuple[str, str]] = []
    trailers: list[tuple[str, str]] = []
    body = b""
    try:
        while True:
            data = conn.recv(65536)
            assert data, "the gateway closed the connection"
            for event in h2c.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    headers = [(str(k), str(v)) for k, v in event.headers]
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    h2c.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.TrailersReceived):
                    trailers = [(str(k), str(v)) for k, v in event.headers]
                elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                    return headers, body, trailers
            conn.sendall(h2c.data_to_send())
    finally:
        conn.close()


@pytest.mark.parametrize(
    "frame_size",
    [None, 5],
    ids=["in one DATA frame", "in 5-byte DATA frames, the key split across them"],
)
def test_a_secret_echoed_in_http2_trailers_reaches_the_guest_as_its_placeholder(
    start_gateway: GatewayFactory, pki: Any, monkeypatch: pytest.MonkeyPatch, frame_size: int | None
) -> None:
    from support.h2_upstream import TrailersUpstream

    monkeypatch.setenv("SANDGATE_TEST_SECRET", REAL)
    # gRPC puts an error's text in the grpc-message trailer: an echo of the key the call carried.
    echo = [("grpc-status", "16"), ("grpc-message", f"invalid key {REAL}")]
    sent = b'{"ok": true, "echo": "' + REAL.encode() + b'"}' + b" " * 300
    with TrailersUpstream(pki, "127.0.0.2", body=sent, trailers=echo, frame_size=frame_size) as upstream:
        creds = [
            {
                "name": "openai",
                "secret": "env:SANDGATE_TEST_SECRET",
                "hosts": ["api.test"],
                "ports": [upstream.port],
                "env": "OPENAI_API_KEY",
                "inject": {"header": "Authorization", "format": "Bearer {secret}"},
            }
        ]
        rules = [{"hosts": ["api.test"], "ports": [upstream.port]}]
        gw = start_gateway({"t1.yaml": tenant("t1", "sb1", TOKEN_REF, rules, creds)})
        ph = placeholders(gw, "sb1")["OPENAI_API_KEY"]
        headers, body, trailers = _h2_get(gw, upstream.port)
    assert dict(headers)[":status"] == "200" and upstream.requests == 1
    assert ("grpc-message", f"invalid key {ph}") in trailers, trailers
    assert body == sent.replace(REAL.encode(), ph.encode()), "every byte, in order, the key scrubbed"
    assert REAL not in repr(trailers) + repr(headers) + body.decode()
    assert_no_secret_anywhere(gw)
