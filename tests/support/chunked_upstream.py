"""An HTTP/1.1 upstream that streams its answer in the chunks a test plans, as a model API
streams server-sent events: each planned chunk is one chunk of the chunked encoding, written
on its own (TCP_NODELAY), so the gateway reads them as they come.

The plan is the answer to every request until the next `plan(...)`. In each planned chunk
`ECHO` stands for the `Authorization` value the request carried (the key the gateway
injected), so a secret can be split across chunk boundaries anywhere. The whole body is
gzip-compressed first (one `Content-Encoding: gzip` stream, then cut at the same sizes) when
the plan says so. Plain HTTP or TLS (with the PKI's leaf), keep-alive, one thread a connection.
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from .pki import TestPKI

__all__ = ["ECHO", "ChunkedUpstream", "Plan", "cut"]

ECHO = b"{{echo}}"


@dataclass(frozen=True)
class Plan:
    """What to answer: the body as `parts` (each `ECHO` in them filled in), sent as one chunk a
    part, or cut into chunks of `sizes` (in turn) once filled in; the content type; whether to
    gzip the body first (then the compressed bytes are cut likewise); a pause after each
    chunk (seconds); header lines to add."""

    parts: Sequence[bytes]
    sizes: Sequence[int] = ()
    content_type: str = "text/event-stream"
    gzip: bool = False
    pause: float = 0.0
    headers: Sequence[bytes] = ()

    def body(self, echo: bytes) -> bytes:
        return b"".join(self.parts).replace(ECHO, echo)

    def chunks(self, echo: bytes) -> list[bytes]:
        """The chunks as they go on the wire."""
        if self.gzip:
            return cut(gzip.compress(self.body(echo)), self.sizes or [len(p) for p in self.parts])
        if self.sizes:
            return cut(self.body(echo), self.sizes)
        return [p.replace(ECHO, echo) for p in self.parts]


class ChunkedUpstream:
    """`with ChunkedUpstream("127.0.0.2", pki=...) as up: up.plan(Plan([...]))`; `up.port`."""

    def __init__(self, host: str, pki: TestPKI | None = None) -> None:
        self._ctx = pki.server_context() if pki is not None else None
        self._sock = socket.create_server((host, 0))
        self.port: int = self._sock.getsockname()[1]
        self._plan = Plan([b"ok"])
        self.requests = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="chunked-upstream", daemon=True)

    def plan(self, plan: Plan) -> None:
        with self._lock:
            self._plan = plan

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=10)

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(raw,), daemon=True).start()

    def _connection(self, raw: socket.socket) -> None:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        raw.settimeout(15)
        try:
            conn = self._ctx.wrap_socket(raw, server_side=True) if self._ctx is not None else raw
        except (OSError, ssl.SSLError):
            raw.close()
            return
        with conn:
            buf = b""
            try:
                while True:
                    while b"\r\n\r\n" not in buf:
                        data = conn.recv(65536)
                        if not data:
                            return
                        buf += data
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    self._answer(conn, _authorization(head))
            except (OSError, ssl.SSLError):
                return

    def _answer(self, conn: socket.socket, echo: bytes) -> None:
        with self._lock:
            plan = self._plan
            self.requests += 1
        chunks = plan.chunks(echo)
        extra = b"".join(line + b"\r\n" for line in plan.headers)
        if plan.gzip:
            extra += b"Content-Encoding: gzip\r\n"
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: "
            + plan.content_type.encode()
            + b"\r\n"
            + extra
            + b"Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n\r\n"
        )
        for chunk in chunks:
            if chunk:
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                if plan.pause:
                    time.sleep(plan.pause)
        conn.sendall(b"0\r\n\r\n")


def _authorization(head: bytes) -> bytes:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"authorization":
            return value.strip()
    return b""


def cut(data: bytes, sizes: Sequence[int]) -> list[bytes]:
    """`data` cut into pieces of `sizes` (in turn, again from the first)."""
    pieces, pos, i = [], 0, 0
    while pos < len(data):
        size = max(sizes[i % len(sizes)], 1)
        pieces.append(data[pos : pos + size])
        pos += size
        i += 1
    return pieces
