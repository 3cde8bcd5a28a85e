"""WebSocket peers for end-to-end tests: an upstream and a guest, both wsproto.

`WebSocketUpstream` is a TLS WebSocket server on loopback that records every frame it gets
and acts on cue (it accepts permessage-deflate when the guest offers it). What it records, per connection, in arrival order (`events`): `("text", data)`, `("bytes",
size, sha256 hex)` for a whole binary message (counted as it streams in, never held),
`("ping", payload)`, `("pong", payload)`, `("close", code, reason)`, and `("eof",)` when the
connection ends. It answers a ping with its pong, echoes a text message as `echo: <text>`,
and acts on these texts from the guest:

- `ping-me:<hex>` / `pong-me:<hex>`: sends a PING / PONG with that payload;
- `close-me:<code>:<reason>`: sends a CLOSE with that code and reason;
- `send-bytes:<size>:<fragment>`: sends one binary message of `size` bytes in fragments.

Every handshake's head is kept in `heads` (the credential the gateway injected is in it).

`WebSocketGuest` is a guest's WebSocket through the gateway's explicit proxy (CONNECT, TLS
intercepted with the gateway's CA), collecting every event it receives.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    Pong,
    Request,
    TextMessage,
)
from wsproto.extensions import PerMessageDeflate

from .pki import TestPKI

__all__ = ["WebSocketGuest", "WebSocketUpstream"]

Record = tuple[Any, ...]


class WebSocketUpstream:
    """See the module docstring; use as a context manager."""

    def __init__(self, host: str, pki: TestPKI) -> None:
        self._ctx = pki.server_context()
        self._ctx.set_alpn_protocols(["http/1.1"])
        self._sock = socket.create_server((host, 0))
        self.port: int = self._sock.getsockname()[1]
        self._cond = threading.Condition()
        self.heads: list[bytes] = []
        self.events: list[list[Record]] = []
        self._threads: list[threading.Thread] = []
        self._open: list[socket.socket] = []

    def __enter__(self) -> Self:
        thread = threading.Thread(target=self._accept, name="ws-upstream", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with self._cond:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)

    def wait_for(self, conn_id: int, kind: str, timeout: float = 10.0) -> list[Record]:
        """Connection `conn_id`'s records once one of `kind` is among them (or at `timeout`)."""
        with self._cond:
            self._cond.wait_for(
                lambda: len(self.events) > conn_id and any(r[0] == kind for r in self.events[conn_id]),
                timeout,
            )
            return list(self.events[conn_id]) if len(self.events) > conn_id else []

    def all_bytes(self) -> bytes:
        """Everything recorded, as one byte string (to assert a value never arrived)."""
        with self._cond:
            return repr(self.events).encode()

    # -- serving -----------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._cond:
                conn_id = len(self.events)
                self.events.append([])
                self._open.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn, conn_id), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _record(self, conn_id: int, record: Record) -> None:
        with self._cond:
            self.events[conn_id].append(record)
            self._cond.notify_all()

    def _serve(self, raw: socket.socket, conn_id: int) -> None:
        conn: socket.socket = raw
        try:
            conn = self._ctx.wrap_socket(raw, server_side=True)
            conn.settimeout(30)
            self._websocket(conn, conn_id)
        except (OSError, ssl.SSLError):
            pass
        finally:
            self._record(conn_id, ("eof",))
            conn.close()
            raw.close()

    def _websocket(self, conn: socket.socket, conn_id: int) -> None:
        ws = WSConnection(ConnectionType.SERVER)
        binary = _Binary()
        while True:
            data = conn.recv(65536)
            if not data:
                return
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, Request):
                    with self._cond:
                        self.heads.append(data.partition(b"\r\n\r\n")[0])
                    conn.sendall(ws.send(AcceptConnection(extensions=[PerMessageDeflate()])))
                elif isinstance(event, BytesMessage):
                    done = binary.add(bytes(event.data), event.message_finished)
                    if done is not None:
                        self._record(conn_id, ("bytes", *done))
                elif isinstance(event, CloseConnection):
                    self._record(conn_id, ("close", event.code, event.reason))
                    with contextlib.suppress(Exception):
                        conn.sendall(ws.send(event.response()))
                    return
                else:
                    self._answer(ws, conn, conn_id, event)

    def _answer(self, ws: WSConnection, conn: socket.socket, conn_id: int, event: Event) -> None:
        if isinstance(event, Ping):
            self._record(conn_id, ("ping", bytes(event.payload)))
            conn.sendall(ws.send(event.response()))
        elif isinstance(event, Pong):
            self._record(conn_id, ("pong", bytes(event.payload)))
        elif isinstance(event, TextMessage) and event.message_finished:
            self._record(conn_id, ("text", event.data))
            conn.sendall(b"".join(ws.send(e) for e in _cue(event.data)))


class _Binary:
    """One binary message's size and digest, counted as its fragments arrive."""

    def __init__(self) -> None:
        self.size = 0
        self.digest = hashlib.sha256()

    def add(self, data: bytes, finished: bool) -> tuple[int, str] | None:
        self.size += len(data)
        self.digest.update(data)
        if not finished:
            return None
        done = (self.size, self.digest.hexdigest())
        self.size, self.digest = 0, hashlib.sha256()
        return done


def _cue(text: str) -> list[Event]:
    """What the upstream sends for a text message from the guest (see the module docstring)."""
    verb, _, arg = text.partition(":")
    if verb == "ping-me":
        return [Ping(payload=bytes.fromhex(arg))]
    if verb == "pong-me":
        return [Pong(payload=bytes.fromhex(arg))]
    if verb == "close-me":
        code, _, reason = arg.partition(":")
        return [CloseConnection(code=int(code), reason=reason)]
    if verb == "send-bytes":
        size, _, fragment = arg.partition(":")
        return _fragments(int(size), int(fragment))
    return [TextMessage(data="echo: " + text)]


def _fragments(size: int, fragment: int) -> list[Event]:
    chunk = b"u" * fragment
    out: list[Event] = []
    sent = 0
    while size - sent > fragment:
        out.append(BytesMessage(data=chunk, message_finished=False))
        sent += fragment
    out.append(BytesMessage(data=b"u" * (size - sent), message_finished=True))
    return out


class WebSocketGuest:
    """A guest's WebSocket to `host:port` through the gateway at 127.0.0.1:`proxy_port`."""

    def __init__(
        self,
        proxy_port: int,
        ca_file: Path,
        host: str,
        port: int,
        credentials: tuple[str, str],
        headers: Sequence[tuple[bytes, bytes]] = (),
        deflate: bool = False,
    ) -> None:
        auth = base64.b64encode(":".join(credentials).encode()).decode()
        raw = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
        raw.sendall(
            f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        answer = raw.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        ctx = ssl.create_default_context(cafile=str(ca_file))
        ctx.set_alpn_protocols(["http/1.1"])
        self.tls = ctx.wrap_socket(raw, server_hostname=host)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.events: list[Event] = []
        self.received = b""  # every byte that arrived (decrypted), to assert a value never did
        self.sent_bytes = 0  # WebSocket bytes sent (frames as on the wire, inside TLS)
        self.eof = False
        offer = [PerMessageDeflate()] if deflate else []
        self.send(Request(host=f"{host}:{port}", target="/ws", extra_headers=list(headers), extensions=offer))
        assert self.wait(lambda evs: any(isinstance(e, AcceptConnection) for e in evs)), self.events

    def send(self, event: Event) -> None:
        data = self.ws.send(event)
        self.tls.sendall(data)
        self.sent_bytes += len(data)

    def wait(self, done: Callable[[list[Event]], bool], timeout: float = 10.0) -> bool:
        """Read until `done(events)` holds (True), or the connection ends or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while not done(self.events):
            if self.eof or time.monotonic() > deadline:
                return False
            self.tls.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                self._feed(self.tls.recv(65536))
            except TimeoutError:
                pass
            except (OSError, ssl.SSLError):
                self.eof = True
        return True

    def close_event(self, timeout: float = 10.0) -> CloseConnection | None:
        """The CLOSE the guest received (waiting for it), or None."""
        self.wait(lambda evs: any(isinstance(e, CloseConnection) for e in evs), timeout)
        return next((e for e in self.events if isinstance(e, CloseConnection)), None)

    def send_until_refused(self, event: Event, piece: int = 4096) -> int:
        """Send `event` in `piece`-byte writes, stopping once the gateway answered or closed
        (a refusal may come before the whole message is written); returns the bytes sent."""
        data = self.ws.send(event)
        sent = 0
        while sent < len(data):
            try:
                self.tls.sendall(data[sent : sent + piece])
            except (OSError, ssl.SSLError):
                break
            sent += min(piece, len(data) - sent)
            if self._poll():
                break
        self.sent_bytes += sent
        return sent

    def send_message(self, size: int, fragment: int) -> int:
        """Send one binary message of `size` bytes in `fragment`-byte frames, stopping early
        when the gateway answers or closes; returns the bytes sent."""
        chunk = b"g" * fragment
        sent = 0
        while sent < size:
            n = min(fragment, size - sent)
            try:
                self.send(BytesMessage(chunk[:n], message_finished=sent + n >= size))
            except (OSError, ssl.SSLError):
                break
            sent += n
            if self._poll():
                break
        return sent

    def _poll(self) -> bool:
        """Read what has arrived, without waiting; True once something ended the session."""
        self.tls.settimeout(0.0)
        try:
            while True:
                self._feed(self.tls.recv(65536))
                if self.eof:
                    break
        except (ssl.SSLWantReadError, BlockingIOError):
            pass
        except (OSError, ssl.SSLError):
            self.eof = True
        finally:
            self.tls.settimeout(10)
        return self.eof or any(isinstance(e, CloseConnection) for e in self.events)

    def _feed(self, data: bytes) -> None:
        if not data:
            self.eof = True
            return
        self.received += data
        self.ws.receive_data(data)
        self.events += list(self.ws.events())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.tls.close()
