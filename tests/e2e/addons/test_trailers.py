"""HTTP/1 trailers: mitmproxy cannot relay them; the guest gets an answer at once, never a hang."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Self

import pytest
from conftest import TOKEN, UPSTREAM_IP, GatewayFactory, tenant_yaml

pytestmark = pytest.mark.slow

AUTH = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
    b"5\r\nhello\r\n0\r\nX-Checksum: 5d41402abc4b2a76\r\n\r\n"
)


class TrailerUpstream:
    """Plain HTTP/1.1 on loopback: answers every complete request with a chunked body and a trailer.

    Records each complete request head and whether each connection ended (EOF from the gateway).
    """

    def __init__(self, host: str) -> None:
        self._sock = socket.create_server((host, 0))
        self.port: int = self._sock.getsockname()[1]
        self._cond = threading.Condition()
        self.complete: list[bytes] = []
        self.connections = 0
        self.closed = 0
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []

    def __enter__(self) -> Self:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # close() alone does not wake a thread blocked in accept() (it would wait out the join).
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)

    def wait_closed(self, count: int, timeout: float = 5.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.closed >= count, timeout)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._cond:
                self.connections += 1
                self._conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            conn.settimeout(30)
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buf += chunk
                head, sep, body = buf.partition(b"\r\n\r\n")
                if not sep:
                    continue
                if b"chunked" in head.lower() and not body.endswith(b"\r\n\r\n"):
                    continue  # wait for the last chunk (and trailers)
                with self._cond:
                    self.complete.append(head)
                conn.sendall(RESPONSE)
                buf = b""
        except OSError:
            pass
        finally:
            conn.close()
            with self._cond:
                self.closed += 1
                self._cond.notify_all()


@pytest.fixture
def trailers() -> Iterator[TrailerUpstream]:
    with TrailerUpstream(UPSTREAM_IP) as up:
        yield up


def _exchange(port: int, request: bytes, timeout: float = 20) -> tuple[bytes, bool, float]:
    """Send `request` to the gateway; (all it answered, whether it closed, seconds taken)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except TimeoutError:
            return data, False, time.monotonic() - started
        except ConnectionResetError:
            pass
    return data, True, time.monotonic() - started


def test_a_response_with_trailers_is_answered_502_at_once_and_both_sides_close(
    start_gateway: GatewayFactory, trailers: TrailerUpstream
) -> None:
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [trailers.port]}])})
    url = f"http://api.test:{trailers.port}/sum"
    data, closed, took = _exchange(
        gw.port,
        f"GET {url} HTTP/1.1\r\nHost: api.test:{trailers.port}\r\nProxy-Authorization: Basic {AUTH}\r\n"
        "TE: trailers\r\n\r\n".encode(),
    )
    assert took < 5 and closed, f"the guest waited {took:.1f}s"
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 502")
    assert b"X-Sandgate-Reason: upstream_unreachable" in head
    answer = json.loads(body)
    assert answer["reason"] == "upstream_unreachable" and answer["host"] == "api.test"
    assert trailers.wait_closed(1), "the upstream connection is closed too"
    record = gw.record(answer["decision_id"])
    assert (record["status"], record["error"]) == (502, "HTTP/1 trailers cannot be relayed")
    assert "Traceback" not in gw.log() and "crashed" not in gw.log()


def test_a_request_with_trailers_is_cut_before_it_completes_upstream(
    start_gateway: GatewayFactory, trailers: TrailerUpstream
) -> None:
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [trailers.port]}])})
    url = f"http://api.test:{trailers.port}/upload"
    data, closed, took = _exchange(
        gw.port,
        f"POST {url} HTTP/1.1\r\nHost: api.test:{trailers.port}\r\nProxy-Authorization: Basic {AUTH}\r\n"
        "Transfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
        "5\r\nhello\r\n0\r\nX-Checksum: abc\r\n\r\n".encode(),
    )
    assert took < 5 and closed, f"the guest waited {took:.1f}s"
    assert not data.startswith(b"HTTP/1.1 200")
    assert trailers.wait_closed(trailers.connections)
    assert trailers.complete == [], "the upstream never saw a complete request"
    (record,) = [r for r in gw.records(1) if r["phase"] == "request"]
    assert record["error"] == "HTTP/1 trailers cannot be relayed"
    assert "Traceback" not in gw.log() and "crashed" not in gw.log()
