"""mitmproxy's own refusals, end to end: no wire bytes in answers, records or logs, every one audited.

A real gateway injects a real credential; a raw-socket upstream on loopback reflects it into
a response mitmproxy cannot parse. Raw-socket clients send what mitmproxy rejects itself.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import SANDGATE, TOKEN, TOKEN_REF, UPSTREAM_IP, GatewayFactory, RunningGateway, tenant_yaml
from support import RecordingUpstream, ReflectingUpstream, ScriptedDNSServer, TestPKI, header_value

pytestmark = pytest.mark.slow

SECRET = "sk-live-REFLECTED-0123456789abcdef"
PROXY_AUTH = "Proxy-Authorization: Basic " + base64.b64encode(f"sb1:{TOKEN}".encode()).decode()


def _bearer(head: bytes) -> bytes:
    return header_value(head, b"authorization")


def _chunked(head: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _bearer(head) + b"\r\nxx\r\n0\r\n\r\n"


# Malformed answers that quote the injected `Authorization` value, one per mitmproxy error path.
REFLECTIONS: dict[str, Callable[[bytes], bytes]] = {
    "a header line without a colon": lambda h: (
        b"HTTP/1.1 200 OK\r\n" + _bearer(h) + b"\r\nContent-Length: 0\r\n\r\n"
    ),
    "a bad Content-Length": lambda h: b"HTTP/1.1 200 OK\r\nContent-Length: " + _bearer(h) + b"\r\n\r\n",
    "a bad status line": lambda h: b"HTTP/1.1 " + _bearer(h) + b"\r\nContent-Length: 0\r\n\r\n",
    "an invalid header name": lambda h: (
        b"HTTP/1.1 200 OK\r\n" + _bearer(h).replace(b" ", b"@") + b": x\r\n\r\n"
    ),
    "an unknown Transfer-Encoding": lambda h: (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: " + _bearer(h) + b"\r\n\r\n"
    ),
    "a bad chunk header": _chunked,
    "a head cut off by a close": lambda h: b"HTTP/1.1 200 OK\r\nX-Echo: " + _bearer(h),
}


def _credential_tenant(port: int) -> str:
    return yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
            "allow": [{"hosts": ["api.test"], "ports": [port], "inspect": True}],
            "credentials": [
                {
                    "name": "openai",
                    "secret": "env:SANDGATE_TEST_REFLECTED",
                    "hosts": ["api.test"],
                    "ports": [port],
                    "env": "OPENAI_API_KEY",
                    "inject": {"header": "Authorization", "format": "Bearer {secret}"},
                }
            ],
        },
        sort_keys=False,
    )


def _placeholder(gw: RunningGateway) -> str:
    import subprocess

    out = subprocess.run(
        [SANDGATE, "credentials", "placeholders", "--sandbox", "sb1", "--format", "json"]
        + ["--config", str(gw.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout)["OPENAI_API_KEY"])


def _assert_no_secret(gw: RunningGateway, *texts: str) -> None:
    for where, text in [
        ("audit", gw.audit_path.read_text()),
        ("log", gw.log()),
        *[("answer", t) for t in texts],
    ]:
        assert SECRET not in text, f"the reflected secret reached the {where}"
        assert SECRET.replace("-", "_") not in text, f"the reflected secret reached the {where}"


@pytest.fixture(scope="module")
def reflecting_upstream(pki: TestPKI) -> Iterator[ReflectingUpstream]:
    """The module's reflecting upstream; each test sets the reply it tries."""
    with ReflectingUpstream("127.0.0.2", next(iter(REFLECTIONS.values())), tls=pki) as upstream:
        yield upstream


@pytest.fixture(scope="module")
def reflecting_gateway(
    start_module_gateway: GatewayFactory, reflecting_upstream: ReflectingUpstream
) -> tuple[RunningGateway, str]:
    """A gateway holding the secret for the reflecting upstream (tests only send requests through
    it), and sb1's placeholder for it."""
    gw = start_module_gateway(
        {"t1.yaml": _credential_tenant(reflecting_upstream.port)}, env={"SANDGATE_TEST_REFLECTED": SECRET}
    )
    return gw, _placeholder(gw)


@pytest.mark.parametrize(
    "shape", list(REFLECTIONS), ids=lambda s: f"an upstream reflecting the secret in {s}"
)
def test_a_secret_reflected_into_a_malformed_response_reaches_neither_guest_nor_audit_nor_log(
    reflecting_gateway: tuple[RunningGateway, str], reflecting_upstream: ReflectingUpstream, shape: str
) -> None:
    gw, ph = reflecting_gateway
    upstream = reflecting_upstream
    upstream.reply = REFLECTIONS[shape]
    upstream.heads.clear()
    gw.mark()  # records() shows this test's only
    verify = ssl.create_default_context(cafile=str(gw.ca_file))
    with httpx.Client(proxy=gw.proxy(), verify=verify, timeout=10) as c:
        try:
            resp: httpx.Response | None = c.get(
                f"https://api.test:{upstream.port}/v1/x", headers={"Authorization": f"Bearer {ph}"}
            )
        except httpx.RemoteProtocolError:
            resp = None  # the head was already streamed (scrubbed): the body is cut
    assert [h for h in upstream.heads if f"Bearer {SECRET}".encode() in h], "the credential was injected"
    (record,) = [r for r in gw.records(3) if r["phase"] == "request"]
    assert (record["decision"], record["reason"]) == ("allow", "upstream_protocol_error")
    assert record["error"] in ("malformed upstream response", "upstream closed the connection")
    assert record["credentials"] == ["openai"]
    answer = ""
    if shape == "a bad chunk header":
        assert resp is None
    else:
        assert resp is not None
        assert (resp.status_code, resp.headers["X-Sandgate-Reason"]) == (502, "upstream_protocol_error")
        assert resp.json()["decision_id"] == record["decision_id"]
        assert record["status"] == 502
        answer = resp.text + str(resp.headers)
    time.sleep(0.3)  # let the log catch up with the record
    _assert_no_secret(gw, answer)


def _raw(port: int, data: bytes, *, before: bytes | None = None, timeout: float = 10) -> bytes:
    """Send `data` on a fresh connection to the gateway (after `before`'s answer, if any); the reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        if before is not None:
            s.sendall(before)
            _read_response(s)
        s.sendall(data)
        return _read_until_close(s)


def _read_response(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(header_value(head + b"\r\n", b"content-length") or b"0")
    while len(rest) < length:
        rest += s.recv(65536)
    return head + b"\r\n\r\n" + rest


def _read_until_close(s: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


@pytest.fixture(scope="module")
def shared_plain_gateway(
    start_module_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> RunningGateway:
    return start_module_gateway(
        {"t1.yaml": tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [http_upstream.port]}])}
    )


@pytest.fixture
def plain_gateway(shared_plain_gateway: RunningGateway) -> RunningGateway:
    """One gateway for the malformed-request tests: each finds its records by decision id."""
    shared_plain_gateway.mark()
    return shared_plain_gateway


MARK = "OFFENDING9f3b"


def _requests(port: int) -> dict[str, bytes]:
    target = f"http://api.test:{port}/{MARK}"
    host = f"Host: api.test:{port}\r\n{PROXY_AUTH}\r\n"
    return {
        "Content-Length with Transfer-Encoding": (
            f"POST {target} HTTP/1.1\r\n{host}Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        ).encode(),
        "two Content-Length headers": (
            f"POST {target} HTTP/1.1\r\n{host}Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello"
        ).encode(),
        "a comma-list Content-Length": f"POST {target} HTTP/1.1\r\n{host}Content-Length: 5, 5\r\n\r\nhello".encode(),
        "an obfuscated Transfer-Encoding": (
            f"POST {target} HTTP/1.1\r\n{host}Transfer-Encoding: x{MARK}chunked\r\n\r\n0\r\n\r\n"
        ).encode(),
        "userinfo in the URL": f"GET http://{MARK}:pw@api.test:{port}/ HTTP/1.1\r\n{host}\r\n".encode(),
        "userinfo in the CONNECT target": f"CONNECT {MARK}@api.test:443 HTTP/1.1\r\n{host}\r\n".encode(),
        "CONNECT to port 0": f"CONNECT {MARK}.api.test:0 HTTP/1.1\r\n{host}\r\n".encode(),
        "CONNECT to port 65536": f"CONNECT {MARK}.api.test:65536 HTTP/1.1\r\n{host}\r\n".encode(),
        "CONNECT without a port": f"CONNECT {MARK}.api.test HTTP/1.1\r\n{host}\r\n".encode(),
        "a non-ASCII host": f"GET http://{MARK}.äpi.test:{port}/ HTTP/1.1\r\n{host}\r\n".encode(),
        "an over-long host": f"GET http://{MARK}{'a' * 300}.test:{port}/ HTTP/1.1\r\n{host}\r\n".encode(),
        "non-UTF-8 path bytes": f"GET http://api.test:{port}/{MARK}".encode()
        + b"\xff\xfe HTTP/1.1\r\n"
        + host.encode()
        + b"\r\n",
        "garbage": f"{MARK} garbage\r\n\r\n".encode(),
        "a request line without a version": f"GET /{MARK}\r\n\r\n".encode(),
        "an origin-form request without Host": f"GET /{MARK} HTTP/1.1\r\n\r\n".encode(),
    }


CASES = list(_requests(1))


def _assert_refused(gw: RunningGateway, answer: bytes) -> dict[str, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"X-Sandgate-Reason: invalid_request" in head
    assert MARK.encode() not in answer, "the answer echoes the offending bytes"
    fields = json.loads(body)
    assert fields["reason"] == "invalid_request"
    record = gw.record(fields["decision_id"])
    assert (record["decision"], record["reason"], record["status"]) == ("deny", "invalid_request", 400)
    same = [r for r in gw.settled(0.2) if r["decision_id"] == fields["decision_id"]]  # none later either
    assert len(same) == 1
    return record


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c} gets 400 invalid_request and one record")
def test_a_request_mitmproxy_rejects_is_answered_and_audited(
    plain_gateway: RunningGateway, http_upstream: RecordingUpstream, case: str
) -> None:
    answer = _raw(plain_gateway.port, _requests(http_upstream.port)[case])
    record = _assert_refused(plain_gateway, answer)
    assert record["listener"].startswith("regular@")
    assert record["client"].startswith("127.0.0.1:")
    assert MARK not in plain_gateway.audit_path.read_text()
    assert http_upstream.requests == []
    time.sleep(0.2)
    assert MARK not in plain_gateway.log()
    assert "Traceback" not in plain_gateway.log()


def test_a_bad_request_after_an_authenticated_one_is_audited_with_its_sandbox(
    plain_gateway: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    port = http_upstream.port
    good = f"GET http://api.test:{port}/ok HTTP/1.1\r\nHost: api.test:{port}\r\n{PROXY_AUTH}\r\n\r\n".encode()
    answer = _raw(plain_gateway.port, _requests(port)["two Content-Length headers"], before=good)
    record = _assert_refused(plain_gateway, answer)
    assert (record["tenant"], record["sandbox"]) == ("t1", "sb1")


def test_a_connect_inside_a_tunnel_is_audited_with_the_tunnel_sandbox(
    plain_gateway: RunningGateway, http_upstream: RecordingUpstream
) -> None:
    port = http_upstream.port
    tunnel = f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n{PROXY_AUTH}\r\n\r\n".encode()
    inner = f"CONNECT {MARK}.test:443 HTTP/1.1\r\nHost: {MARK}.test:443\r\n\r\n".encode()
    answer = _raw(plain_gateway.port, inner, before=tunnel)
    record = _assert_refused(plain_gateway, answer)
    assert (record["tenant"], record["sandbox"], record["dest"]["host"]) == ("t1", "sb1", "api.test")


@pytest.fixture
def streamed_gateway(start_gateway: GatewayFactory, http_upstream: RecordingUpstream) -> RunningGateway:
    doc = yaml.safe_load(tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [http_upstream.port]}]))
    doc["limits"] = {"request_body_bytes": 1 << 20}
    return start_gateway({"t1.yaml": yaml.safe_dump(doc)})


def _chunks(size: int) -> Iterator[bytes]:
    for _ in range(size // 65536):
        yield b"z" * 65536


@pytest.mark.parametrize(
    ("host", "body", "status", "reason"),
    [
        ("other.test", b"z" * (2 << 20), 403, "host_not_allowed"),
        ("api.test", b"z" * (2 << 20), 413, "body_too_large"),
        ("api.test", None, 413, "body_too_large"),
    ],
    ids=[
        "a denied request with a 2 MiB body",
        "a declared 2 MiB body over the limit",
        "a chunked body cut at the limit",
    ],
)
def test_refusing_a_streamed_body_answers_once_and_crashes_nothing(
    streamed_gateway: RunningGateway,
    http_upstream: RecordingUpstream,
    host: str,
    body: bytes | None,
    status: int,
    reason: str,
) -> None:
    with httpx.Client(proxy=streamed_gateway.proxy(), timeout=20) as c:
        resp = c.post(
            f"{http_upstream.url_for(host)}/big", content=body if body is not None else _chunks(3 << 20)
        )
        assert (resp.status_code, resp.headers["X-Sandgate-Reason"]) == (status, reason)
        # The gateway still serves this client and others.
        assert c.get(f"{http_upstream.url_for('api.test')}/after").status_code == 200
    decision_id = resp.json()["decision_id"]
    records = [r for r in streamed_gateway.records(2) if r["reason"] == reason]
    assert [r["decision_id"] for r in records] == [decision_id]
    assert [r.target for r in http_upstream.requests if r.target == "/big" and len(r.body) > 0] == []
    time.sleep(0.3)
    assert streamed_gateway.stop() == 0
    log = streamed_gateway.log()
    assert "has crashed" not in log
    assert "Traceback" not in log
    # The refused request ended like any other: nothing was left in flight to drain.
    (shutdown,) = [json.loads(line) for line in log.splitlines() if '"gateway.shutdown"' in line]
    assert shutdown["in_flight_at_signal"] == 0


def test_a_dns_failure_answers_502_not_403(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    with ScriptedDNSServer(records={"api.test": [UPSTREAM_IP]}) as dns:  # nowhere.test: NXDOMAIN
        gw = start_gateway(
            {"t1.yaml": tenant_yaml("t1", [{"hosts": ["nowhere.test"], "ports": [http_upstream.port]}])},
            config={"resolver": {"hosts": {}, "nameservers": [f"127.0.0.1:{dns.port}"], "ipv6": False}},
        )
        with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
            resp = c.get(f"http://nowhere.test:{http_upstream.port}/")
    assert (resp.status_code, resp.headers["X-Sandgate-Reason"]) == (502, "dns_failure")
    assert resp.json()["reason"] == "dns_failure"
    assert gw.record(resp.json()["decision_id"])["reason"] == "dns_failure"


def test_an_unreachable_upstream_answers_502_upstream_unreachable(
    start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    closed = socket.create_server(("127.0.0.2", 0))
    port = int(closed.getsockname()[1])
    closed.close()  # nothing listens there now: the connect is refused
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [port]}])})
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        resp = c.get(f"http://api.test:{port}/")
    assert (resp.status_code, resp.headers["X-Sandgate-Reason"]) == (502, "upstream_unreachable")
    record = gw.record(resp.json()["decision_id"])
    assert (record["decision"], record["reason"], record["status"], record["error"]) == (
        "allow",
        "upstream_unreachable",
        502,
        "upstream unreachable",
    )
    assert "Connect call failed" not in gw.audit_path.read_text()
