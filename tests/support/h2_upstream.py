"""An HTTPS upstream that speaks HTTP/2 only and ends every response with trailers (as gRPC does).

Each request gets `200`, the fixed `body` and then the fixed `trailers`; served from a
background thread on loopback with the PKI's leaf (ALPN `h2`).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Self

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from .pki import TestPKI

__all__ = ["TrailersUpstream"]


class TrailersUpstream:
    """`with TrailersUpstream(pki, host, body=..., trailers=[...]) as up:`; `up.port`, `up.requests`.
    With `frame_size`, the body goes in DATA frames of that many bytes."""

    def __init__(
        self,
        pki: TestPKI,
        host: str,
        *,
        body: bytes,
        trailers: Sequence[tuple[str, str]],
        frame_size: int | None = None,
    ) -> None:
        self.body = body
        self.frame_size = frame_size or max(len(body), 1)
        self.trailers = list(trailers)
        self.requests = 0
        self._ctx = pki.server_context()
        self._ctx.set_alpn_protocols(["h2"])
        self._sock = socket.create_server((host, 0))
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="h2-trailers", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        # close() alone does not wake a thread blocked in accept() (it would wait out the join).
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
        try:
            conn = self._ctx.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        h2c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        h2c.initiate_connection()
        try:
            conn.sendall(h2c.data_to_send())
            conn.settimeout(10)
            while data := conn.recv(65536):
                for event in h2c.receive_data(data):
                    if isinstance(event, h2.events.StreamEnded):
                        self.requests += 1
                        self._answer(h2c, event.stream_id)
                conn.sendall(h2c.data_to_send())
        except (OSError, ssl.SSLError, h2.exceptions.ProtocolError):
            pass
        finally:
            conn.close()

    def _answer(self, h2c: h2.connection.H2Connection, stream_id: int) -> None:
        h2c.send_headers(
            stream_id, [(":status", "200"), ("content-type", "application/json")], end_stream=False
        )
        for start in range(0, len(self.body), self.frame_size):
            h2c.send_data(stream_id, self.body[start : start + self.frame_size], end_stream=False)
        h2c.send_headers(stream_id, self.trailers, end_stream=True)
