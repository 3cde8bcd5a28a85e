"""A recording HTTP/1.1 upstream (plain or TLS) on loopback, served from a background thread.

Every accepted TCP connection is recorded at accept time, before any TLS handshake, so
a test can assert that a denied request never reached the upstream at all. Every parsed
request is recorded with its headers exactly as they arrived (order, case, duplicates).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http
import json
import socket
import ssl
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Self

from .pki import TestPKI

__all__ = ["RecordedConnection", "RecordedRequest", "RecordingUpstream"]

_HEAD_LIMIT = 1 << 20  # the longest request head accepted, in bytes
_BACKLOG = 1024


@dataclass(frozen=True, slots=True)
class RecordedConnection:
    """One accepted TCP connection; `sni` is filled in after a TLS handshake."""

    id: int
    peer: tuple[str, int]
    tls: bool
    sni: str | None = None
    handshake_ok: bool = False


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as it arrived: headers as (name, value) pairs, body de-chunked."""

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    connection_id: int

    def header(self, name: str) -> str | None:
        """The first value of header `name` (case-insensitive), or None."""
        values = self.header_values(name)
        return values[0] if values else None

    def header_values(self, name: str) -> list[str]:
        """Every value of header `name` (case-insensitive), in arrival order."""
        wanted = name.lower()
        return [v for k, v in self.headers if k.lower() == wanted]

    @property
    def host(self) -> str | None:
        """The Host header."""
        return self.header("host")


class _BadRequest(Exception):
    """The client sent something that is not HTTP/1.x; answer 400 and close."""


class RecordingUpstream:
    """An HTTP/1.1 server that answers every request and records what arrived.

    By default every request gets `200` and a JSON body echoing
    `{"method", "path", "host", "headers", "body_len", "server"}`; `status`, `body` and
    `headers` fix the response instead, and `delay` (seconds) holds each response back.
    With `tls`, it serves HTTPS with the PKI's leaf (ALPN `http/1.1`).

    Use as `with RecordingUpstream() as up: ...` or `start()`/`stop()`.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: TestPKI | None = None,
        *,
        name: str = "upstream",
        status: int = 200,
        body: bytes | None = None,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
        delay: float = 0.0,
    ) -> None:
        self.host = host
        self.name = name
        self.status = status
        self.body = body
        self.content_type = content_type
        self.extra_headers = tuple(headers)
        self.delay = delay
        # What `reset` restores: a test that changes the answer cannot leak it to the next.
        self._answer = (status, body, content_type, self.extra_headers, delay)
        self._requested_port = port
        self._ssl = self._ssl_context(tls) if tls is not None else None
        self._sni: weakref.WeakKeyDictionary[ssl.SSLObject, str | None] = weakref.WeakKeyDictionary()
        self._cond = threading.Condition()
        self._requests: list[RecordedRequest] = []
        self._connections: dict[int, RecordedConnection] = {}
        self._next_connection_id = 0
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    # --- life cycle ------------------------------------------------------------------

    def start(self) -> Self:
        """Listen and serve in a background thread; return once the port is bound."""
        if self._thread is not None:
            raise RuntimeError("already started")
        started: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._serve(started),), name=f"upstream-{self.name}"
        )
        self._thread.start()
        try:
            self._port = started.result(timeout=10)
        except BaseException:
            self._thread.join()
            self._thread = None
            raise
        return self

    def stop(self) -> None:
        """Close the listener and every open connection; wait for the thread to end."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None or loop is None or stopping is None:
            return
        loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout=10)
        if thread.is_alive():
            raise RuntimeError(f"upstream {self.name} did not stop")
        self._thread = self._loop = self._stopping = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- what tests read ------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port (after `start()`)."""
        if self._port is None:
            raise RuntimeError("not started")
        return self._port

    @property
    def scheme(self) -> str:
        return "https" if self._ssl is not None else "http"

    @property
    def url(self) -> str:
        """`http(s)://HOST:PORT` of the listener."""
        return self.url_for(self.host)

    def url_for(self, hostname: str) -> str:
        """`http(s)://HOSTNAME:PORT`, e.g. for a test name that a resolver maps to this server."""
        host = f"[{hostname}]" if ":" in hostname else hostname
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of the requests received since the last `reset()`, in order."""
        with self._cond:
            return list(self._requests)

    @property
    def connections(self) -> list[RecordedConnection]:
        """A snapshot of the TCP connections accepted since the last `reset()`, in order."""
        with self._cond:
            return list(self._connections.values())

    def reset(self) -> None:
        """Forget recorded requests and connections (open connections keep being served), and
        answer as first configured again."""
        with self._cond:
            self._requests.clear()
            self._connections.clear()
        self.status, self.body, self.content_type, self.extra_headers, self.delay = self._answer

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until at least `count` requests were recorded; TimeoutError otherwise."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= count, timeout):
                raise TimeoutError(f"{len(self._requests)} of {count} requests arrived")
            return list(self._requests)

    def wait_for_connections(self, count: int, timeout: float = 5.0) -> list[RecordedConnection]:
        """Block until at least `count` connections were recorded; TimeoutError otherwise."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._connections) >= count, timeout):
                raise TimeoutError(f"{len(self._connections)} of {count} connections arrived")
            return list(self._connections.values())

    # --- serving ---------------------------------------------------------------------

    def _ssl_context(self, pki: TestPKI) -> ssl.SSLContext:
        ctx = pki.server_context()
        ctx.set_alpn_protocols(["http/1.1"])
        ctx.sni_callback = self._on_sni
        return ctx

    def _on_sni(self, sslobj: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        self._sni[sslobj] = name

    async def _serve(self, started: concurrent.futures.Future[int]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            server = await asyncio.start_server(
                self._handle,
                self.host,
                self._requested_port,
                backlog=_BACKLOG,
                limit=_HEAD_LIMIT,
            )
        except BaseException as e:
            started.set_exception(e)
            return
        started.set_result(server.sockets[0].getsockname()[1])
        try:
            await self._stopping.wait()
        finally:
            server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await asyncio.wait_for(server.wait_closed(), timeout=5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            conn_id = self._record_connection(writer)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                await writer.start_tls(self._ssl)
                self._record_handshake(conn_id, writer)
            await self._serve_connection(conn_id, reader, writer)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client went away or spoke garbage; the connection is recorded already
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()

    def _record_connection(self, writer: asyncio.StreamWriter) -> int:
        peer = writer.get_extra_info("peername")
        with self._cond:
            conn_id = self._next_connection_id
            self._next_connection_id += 1
            self._connections[conn_id] = RecordedConnection(
                conn_id, (peer[0], peer[1]), tls=self._ssl is not None
            )
            self._cond.notify_all()
        return conn_id

    def _record_handshake(self, conn_id: int, writer: asyncio.StreamWriter) -> None:
        sslobj = writer.get_extra_info("ssl_object")
        sni = self._sni.pop(sslobj, None) if sslobj is not None else None
        with self._cond:
            if conn_id in self._connections:
                self._connections[conn_id] = replace(self._connections[conn_id], sni=sni, handshake_ok=True)

    async def _serve_connection(
        self, conn_id: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Answer requests on one connection until the client or a `close` ends it."""
        while True:
            try:
                head = await _read_head(reader)
                if head is None:
                    return
                method, target, version, headers = _parse_head(head)
                if _header(headers, "expect").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = await _read_body(reader, headers)
            except (_BadRequest, ValueError, asyncio.LimitOverrunError):
                writer.write(_response(400, [("Connection", "close")], b"bad request\n"))
                await writer.drain()
                return
            request = RecordedRequest(method, target, version, headers, body, conn_id)
            with self._cond:
                self._requests.append(request)
                self._cond.notify_all()
            if self.delay:
                await asyncio.sleep(self.delay)
            keep_alive = _keep_alive(version, headers)
            writer.write(self._respond(request, keep_alive))
            await writer.drain()
            if not keep_alive:
                return

    def _respond(self, request: RecordedRequest, keep_alive: bool) -> bytes:
        if self.body is not None:
            payload = self.body
        else:
            payload = json.dumps(
                {
                    "method": request.method,
                    "path": request.target,
                    "host": request.host,
                    "headers": [list(pair) for pair in request.headers],
                    "body_len": len(request.body),
                    "server": self.name,
                }
            ).encode()
        headers = [("Content-Type", self.content_type), *self.extra_headers]
        if not keep_alive:
            headers.append(("Connection", "close"))
        return _response(self.status, headers, payload, head_only=request.method == "HEAD")


# --- HTTP/1.x, just enough -------------------------------------------------------------


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The request line and headers; None if the client closed between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise _BadRequest("truncated request head") from e
    return head.lstrip(b"\r\n")  # RFC 9112 §2.2: ignore empty lines before a request


def _parse_head(head: bytes) -> tuple[str, str, str, tuple[tuple[str, str], ...]]:
    lines = head.decode("latin-1").split("\r\n")[:-2]
    parts = lines[0].split(" ") if lines else []
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest(f"bad request line {lines[0]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or line[0] in " \t":
            raise _BadRequest(f"bad header line {line!r}")
        headers.append((name, value.strip(" \t")))
    return parts[0], parts[1], parts[2], tuple(headers)


def _header(headers: Sequence[tuple[str, str]], name: str) -> str:
    """All values of `name` joined with ", " (empty if absent)."""
    return ", ".join(v for k, v in headers if k.lower() == name)


async def _read_body(reader: asyncio.StreamReader, headers: Sequence[tuple[str, str]]) -> bytes:
    encodings = [e.strip().lower() for e in _header(headers, "transfer-encoding").split(",")]
    if encodings[-1] == "chunked":
        return await _read_chunked(reader)
    if encodings != [""]:
        raise _BadRequest("transfer-encoding without chunked")
    lengths = {v.strip() for v in _header(headers, "content-length").split(",")} - {""}
    if not lengths:
        return b""
    if len(lengths) != 1 or not next(iter(lengths)).isdigit():
        raise _BadRequest("bad content-length")
    return await reader.readexactly(int(lengths.pop()))


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass  # trailers
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise _BadRequest("chunk without CRLF")


def _keep_alive(version: str, headers: Sequence[tuple[str, str]]) -> bool:
    tokens = {t.strip().lower() for t in _header(headers, "connection").split(",")}
    if version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


def _response(
    status: int, headers: Sequence[tuple[str, str]], body: bytes, *, head_only: bool = False
) -> bytes:
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Status"
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers)]
    lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body
