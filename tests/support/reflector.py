"""A raw-socket upstream on loopback that answers each request head with scripted bytes.

Nothing here is HTTP-aware on purpose: `reply(head)` returns the exact bytes to send (a
malformed response that quotes what the request carried, an early close), so tests can
make an upstream reflect an injected credential into whatever mitmproxy fails to parse.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Self

from .pki import TestPKI

__all__ = ["ReflectingUpstream", "header_value"]


def header_value(head: bytes, name: bytes) -> bytes:
    """The first value of header `name` (case-insensitive) in a raw request head, or b""."""
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name.lower():
            return value.strip()
    return b""


class ReflectingUpstream:
    """Accepts connections (TLS with the PKI's leaf when given), reads one request head each,
    sends `reply(head)` and closes. `heads` keeps every head received."""

    def __init__(self, host: str, reply: Callable[[bytes], bytes], tls: TestPKI | None = None) -> None:
        self.reply = reply
        self.heads: list[bytes] = []
        self._ssl = tls.server_context() if tls is not None else None
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="reflecting-upstream", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, raw: socket.socket) -> None:
        conn: socket.socket = raw
        try:
            conn.settimeout(10)
            if self._ssl is not None:
                conn = self._ssl.wrap_socket(raw, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            self.heads.append(head.split(b"\r\n\r\n", 1)[0])
            conn.sendall(self.reply(head))
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()
