"""The lean layer at the edges a hostile guest or a sloppy upstream reaches, on both paths:
hundreds of pipelined requests the gateway refuses, bytes an upstream sends past its answer,
an upstream that ends in the middle of a chunk. Each exchange is answered and recorded once,
and nothing reaches the upstream undecided."""

from __future__ import annotations

import socket
import ssl
import threading
from typing import Any

import pytest
import yaml
from conftest import TOKEN_REF, GatewayFactory, RunningGateway
from support import RecordingUpstream, TestPKI
from support.tunnels import read_until, tls_tunnel

pytestmark = pytest.mark.slow

UPSTREAM_IP = "127.0.0.2"
PATHS = ("general", "lean")


def _tenant(port: int) -> str:
    doc = {
        "tenant": "t1",
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
        "allow": [{"hosts": ["api.test"], "ports": [port], "inspect": True}],
        "deny": [{"id": "no-admin", "hosts": ["api.test"], "paths": ["/admin/**"]}],
    }
    return yaml.safe_dump(doc, sort_keys=False)


class RawUpstream:
    """A TLS upstream that answers every request on a connection with `reply` (raw bytes),
    then keeps the connection open (or closes it, `close_after`); counts connections."""

    def __init__(self, pki: TestPKI, reply: bytes, *, close_after: bool = False) -> None:
        self.reply, self.close_after = reply, close_after
        self.context = pki.server_context()
        self.listener = socket.create_server((UPSTREAM_IP, 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> RawUpstream:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.listener.close()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(raw,), daemon=True).start()

    def _one(self, raw: socket.socket) -> None:
        try:
            with self.context.wrap_socket(raw, server_side=True) as tls:
                data = b""
                while True:
                    chunk = tls.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                    while b"\r\n\r\n" in data:
                        head, _, data = data.partition(b"\r\n\r\n")
                        self.requests.append(head)
                        tls.sendall(self.reply)
                        if self.close_after:
                            return
        except (OSError, ssl.SSLError):
            return


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _gateway(start: GatewayFactory, port: int, path: str) -> RunningGateway:
    return start({"t1.yaml": _tenant(port)}, config={"interception": {"http1_path": path}})


def test_hundreds_of_pipelined_refused_requests_are_each_answered_and_recorded(
    start_gateway: GatewayFactory, pki: TestPKI, path: str
) -> None:
    count = 400
    with RecordingUpstream(UPSTREAM_IP, tls=pki, name="pipelined") as up:
        gw = _gateway(start_gateway, up.port, path)
        denied = b"GET /admin/x HTTP/1.1\r\nHost: api.test\r\n\r\n"
        with tls_tunnel(gw, up.port) as tls:
            tls.sendall(denied * count + b"GET /last HTTP/1.1\r\nHost: api.test\r\n\r\n")
            data = read_until(tls, lambda d: d.count(b"HTTP/1.1 ") >= count + 1 and d.endswith(b"}"))
        assert data.count(b"HTTP/1.1 403 ") == count
        assert data.count(b"HTTP/1.1 200 ") == 1
        assert [r.target for r in up.requests] == ["/last"], "only the allowed request went upstream"
        records = gw.records_until(lambda rs: sum(r["phase"] == "request" for r in rs) >= count + 1)
        reasons = [r["reason"] for r in records if r["phase"] == "request"]
        assert reasons.count("host_denied") == count and reasons.count("allowed") == 1


SMUGGLED = (
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil"
)


@pytest.mark.parametrize("extra", [SMUGGLED, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok\r\n"])
def test_bytes_an_upstream_sends_past_its_answer_never_answer_the_next_request(
    start_gateway: GatewayFactory, pki: TestPKI, path: str, extra: bytes
) -> None:
    with RawUpstream(pki, extra) as up:
        gw = _gateway(start_gateway, up.port, path)
        with tls_tunnel(gw, up.port) as tls:
            answers = []
            for i in range(2):
                tls.sendall(b"GET /n%d HTTP/1.1\r\nHost: api.test\r\n\r\n" % i)
                answers.append(read_until(tls, lambda d: d.endswith(b"\r\n\r\nok")))
        assert all(a.startswith(b"HTTP/1.1 200") and a.endswith(b"ok") for a in answers), answers
        assert b"evil" not in b"".join(answers)
        assert up.connections == 2, "the upstream that talked past its answer was not asked again"
        assert len(up.requests) == 2
        records = gw.records_until(lambda rs: sum(r["phase"] == "request" for r in rs) >= 2)
        assert [(r["decision"], r["status"]) for r in records if r["phase"] == "request"] == [
            ("allow", 200)
        ] * 2
        assert "Traceback" not in gw.log()


def test_an_upstream_that_ends_inside_a_chunk_fails_the_exchange_at_once(
    start_gateway: GatewayFactory, pki: TestPKI, path: str
) -> None:
    cut = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n5"
    with RawUpstream(pki, cut, close_after=True) as up:
        gw = _gateway(start_gateway, up.port, path)
        with tls_tunnel(gw, up.port) as tls:
            tls.sendall(b"GET /cut HTTP/1.1\r\nHost: api.test\r\n\r\n")
            data = read_until(tls, lambda d: False)  # until the gateway closes (or 10 s)
        record: dict[str, Any]
        (record,) = [
            r
            for r in gw.records_until(lambda rs: any(r["phase"] == "request" for r in rs))
            if r["phase"] == "request"
        ]
        assert record["decision"] == "allow" and record["error"] is not None, record
        assert record["error"] != "client disconnected", "the upstream's end was noticed, not the guest's"
        assert not data.endswith(b"0\r\n\r\n"), "a cut body is never completed"
