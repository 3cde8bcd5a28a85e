"""An upstream that switches protocols (101) on loopback and records what arrives afterwards.

Modes:
- `honour`: a request with `Upgrade: X` gets `101` with `Upgrade: X`; one without gets 200.
- `always`: every request gets `101 Switching Protocols` (`Upgrade: h2c`), asked for or not.
- `h2c`: as `always`, and the HTTP/2 server preface (an empty SETTINGS frame) right behind the
  101 in the same write, as an h2c server sends it.
- `websocket`: a WebSocket server (wsproto): echoes each text message as `echo: <text>`.

After a switch every byte from the client is recorded per connection (`after_switch`), and
each connection's end is recorded (`closed`), so a test can assert that the gateway closed
the upstream socket and forwarded nothing once it refused a switch.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from types import TracebackType
from typing import Literal, Self

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Request, TextMessage

from .pki import TestPKI

__all__ = ["SwitchingUpstream"]

Mode = Literal["honour", "always", "h2c", "websocket"]
# An HTTP/2 SETTINGS frame with no settings: what an h2c server sends right after its 101.
_H2_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


class SwitchingUpstream:
    """A TLS (or plain) server on `host` that switches protocols; see the module docstring."""

    def __init__(self, host: str, mode: Mode, tls: TestPKI | None = None) -> None:
        self.host = host
        self.mode = mode
        self._ctx = tls.server_context() if tls is not None else None
        if self._ctx is not None:
            self._ctx.set_alpn_protocols(["http/1.1"])
        self._sock = socket.create_server((host, 0))
        self.port: int = self._sock.getsockname()[1]
        self._cond = threading.Condition()
        self.heads: list[bytes] = []
        self.after_switch: dict[int, bytes] = {}
        self.messages: list[str] = []
        self.closed: set[int] = set()
        self.connections = 0
        self._threads: list[threading.Thread] = []
        self._open: list[socket.socket] = []

    def __enter__(self) -> Self:
        thread = threading.Thread(target=self._accept, name="switching-upstream", daemon=True)
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
        with self._cond:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)

    def wait_closed(self, conn_id: int, timeout: float = 5.0) -> bool:
        """Whether the gateway closed connection `conn_id` within `timeout` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: conn_id in self.closed, timeout)

    def wait_heads(self, count: int, timeout: float = 5.0) -> list[bytes]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.heads) >= count, timeout)
            return list(self.heads)

    # -- serving -----------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._cond:
                conn_id = self.connections
                self.connections += 1
                self._open.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn, conn_id), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, raw: socket.socket, conn_id: int) -> None:
        conn = raw
        try:
            if self._ctx is not None:
                conn = self._ctx.wrap_socket(raw, server_side=True)
            conn.settimeout(30)
            if self.mode == "websocket":
                self._websocket(conn, conn_id)
            else:
                self._switch(conn, conn_id)
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()
            raw.close()
            with self._cond:
                self.closed.add(conn_id)
                self._cond.notify_all()

    def _read_head(self, conn: socket.socket, buf: bytes) -> tuple[bytes, bytes] | None:
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        with self._cond:
            self.heads.append(head)
            self._cond.notify_all()
        return head, rest

    def _switch(self, conn: socket.socket, conn_id: int) -> None:
        buf = b""
        while True:
            got = self._read_head(conn, buf)
            if got is None:
                return
            head, buf = got
            upgrade = next(
                (
                    line.split(b":", 1)[1].strip()
                    for line in head.split(b"\r\n")[1:]
                    if line.lower().startswith(b"upgrade:")
                ),
                None,
            )
            if self.mode in ("always", "h2c") or upgrade is not None:
                protocol = upgrade or b"h2c"
                conn.sendall(
                    b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "
                    + protocol
                    + b"\r\n\r\n"
                    + (_H2_SETTINGS if self.mode == "h2c" else b"")
                )
                break
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        with self._cond:
            self.after_switch[conn_id] = buf
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return
            with self._cond:
                self.after_switch[conn_id] += chunk
                self._cond.notify_all()

    def _websocket(self, conn: socket.socket, conn_id: int) -> None:
        ws = WSConnection(ConnectionType.SERVER)
        while True:
            data = conn.recv(65536)
            if not data:
                return
            if not self.heads:
                with self._cond:
                    self.heads.append(data.partition(b"\r\n\r\n")[0])
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, Request):
                    conn.sendall(ws.send(AcceptConnection()))
                elif isinstance(event, TextMessage):
                    with self._cond:
                        self.messages.append(event.data)
                        self._cond.notify_all()
                    conn.sendall(ws.send(TextMessage(data="echo: " + event.data)))
                elif isinstance(event, CloseConnection):
                    conn.sendall(ws.send(event.response()))
                    return
