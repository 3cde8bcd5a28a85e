"""A closed-loop HTTP/1.1 load client: keep-alive, N connections, fixed duration, per-request latency.

One client for every row of the benchmark, so rows differ only in what sits between it and
the upstream. It speaks:

- plain HTTP to a server (origin-form) or to a proxy (absolute-form + Proxy-Authorization);
- CONNECT tunnels, then TLS inside (verifying against a given CA, with a given SNI);
- a new connection per request (`--new-conn`: connect, CONNECT, TLS handshake, request,
  close, all inside the measured latency), for connections per second;
- a bulk download (`--bulk N`): one request, the body counted and dropped, MB/s;
- a bounded count of sequential requests (`--requests N`), for latency stalls.

Each of `--concurrency` workers loops request → response on its own connection. Requests
that start during `--warmup` are not recorded; the rate is recorded requests divided by the
measured window. Latency is `time.perf_counter_ns` from writing the request (or opening the
connection, with `--new-conn`) to the last byte of the response.

Run as a script, it prints one JSON object (see `Result`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import socket
import ssl
import sys
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

__all__ = ["ClientConfig", "Result", "percentile", "run"]


@dataclass(slots=True)
class ClientConfig:
    """What to send, where, and how hard."""

    address: tuple[str, int]  # TCP peer: the server, or the proxy
    url: str  # the URL requested; its authority is the Host header (and the CONNECT target)
    proxy: bool = False  # send absolute-form requests (plain HTTP through a proxy)
    connect: bool = False  # open a CONNECT tunnel first (to the URL's authority)
    connect_to: str | None = None  # CONNECT to this authority instead (TLS SNI stays the URL's host)
    tls: bool = False  # TLS to the URL's host (inside the tunnel, if any)
    cafile: str | None = None
    auth: str | None = None  # "user:password" for Proxy-Authorization
    method: str = "GET"
    body_size: int = 0
    concurrency: int = 10
    duration: float = 10.0
    warmup: float = 1.0
    requests: int = 0  # > 0: stop after this many recorded requests (concurrency should be 1)
    new_conn: bool = False
    bulk: int = 0  # > 0: one download of this many bytes from /bulk/<n>
    timeout: float = 30.0
    marks: bool = False  # print measure-start / measure-end on stderr


@dataclass(slots=True)
class Result:
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    rps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    mbps: float = 0.0  # bulk: MB/s (10^6 bytes)
    bytes: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    first_error: str = ""
    latencies_ms: list[float] = field(default_factory=list)  # only with --requests


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile of sorted values (q in 0..100)."""
    if not sorted_values:
        return 0
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[min(len(sorted_values), int(rank)) - 1]


class _ResponseError(Exception):
    pass


class _Conn(asyncio.Protocol):
    """One client connection; parses responses (Content-Length, chunked or until close)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._waiter: asyncio.Future[int] | None = None
        self._head_only = False
        self._status = 0
        self._mode = ""  # "" = reading head, "len", "chunked", "close"
        self._left = 0
        self._chunk_trailer = False
        self.body_bytes = 0
        self._eof = False
        # False once the server said `Connection: close` or the body ran to EOF.
        self.reusable = True

    # -- asyncio.Protocol ----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self._mode in ("len", "close") and not self._buf:
            # Fast path for bodies: count, never buffer (bulk downloads).
            n = len(data) if self._mode == "close" else min(len(data), self._left)
            self._count(n)
            if n < len(data):
                self._buf += data[n:]
            if self._mode == "len" and self._left == 0:
                self._finish()
            return
        self._buf += data
        self._parse()

    def eof_received(self) -> bool | None:
        self._eof = True
        if self._mode == "close":
            self._finish()
        else:
            self._fail(ConnectionResetError("server closed the connection"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._mode == "close" and exc is None:
            self._finish()
        else:
            self._fail(exc or ConnectionResetError("connection lost"))

    # -- requests ------------------------------------------------------------------
    async def exchange(self, data: bytes, *, head_only: bool = False) -> int:
        """Write a request, wait for the whole response; returns the status code."""
        if self.transport is None or self._eof or not self.reusable:
            raise ConnectionResetError("connection closed")
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._head_only = head_only
        self._mode = ""
        self.transport.write(data)
        if self._buf:
            self._parse()
        return await self._waiter

    def _count(self, n: int) -> None:
        self.body_bytes += n
        if self._mode == "len":
            self._left -= n

    def _finish(self) -> None:
        mode, self._mode = self._mode, ""
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(self._status)
        if mode == "close" and self.transport is not None:
            self.transport.close()

    def _fail(self, exc: BaseException) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _parse(self) -> None:
        try:
            self._parse_inner()
        except (ValueError, _ResponseError) as e:
            self._fail(_ResponseError(f"bad response: {e}"))
            if self.transport is not None:
                self.transport.abort()

    def _parse_inner(self) -> None:
        while self._waiter is not None:
            if self._mode == "":
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                self._start(bytes(self._buf[:end]))
                del self._buf[: end + 4]
            elif self._mode in ("len", "close"):
                n = len(self._buf) if self._mode == "close" else min(len(self._buf), self._left)
                self._count(n)
                del self._buf[:n]
                if self._mode == "len" and self._left == 0:
                    self._finish()
                return
            elif self._mode == "chunked" and not self._parse_chunks():
                return

    def _start(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise _ResponseError(lines[0][:80])
        self._status = int(parts[1])
        length: int | None = None
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            lname = name.strip().lower()
            if lname == "content-length":
                length = int(value.strip())
            elif lname == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif lname == "connection" and "close" in value.lower():
                self.reusable = False
        if self._head_only or self._status in (204, 304) or 100 <= self._status < 200:
            if 100 <= self._status < 200 and not self._head_only:
                return  # an interim response: the real one follows
            self._mode = "len"
            self._left = 0
            self._finish()
        elif chunked:
            self._mode, self._left, self._chunk_trailer = "chunked", -1, False
        elif length is not None:
            self._mode, self._left = "len", length
            if length == 0:
                self._finish()
        else:
            self._mode = "close"
            self.reusable = False

    def _parse_chunks(self) -> bool:
        """Consume what is buffered of a chunked body; False when more data is needed."""
        while True:
            if self._chunk_trailer:
                end = self._buf.find(b"\r\n")
                if end < 0:
                    return False
                del self._buf[: end + 2]
                if end == 0:
                    self._finish()
                    return True
                continue
            if self._left < 0:
                end = self._buf.find(b"\r\n")
                if end < 0:
                    return False
                size = int(bytes(self._buf[:end]).split(b";", 1)[0], 16)
                del self._buf[: end + 2]
                if size == 0:
                    self._chunk_trailer = True
                    continue
                self._left = size + 2  # data and its CRLF
            n = min(self._left, len(self._buf))
            self.body_bytes += n
            del self._buf[:n]
            self._left -= n
            if self._left:
                return False
            self._left = -1


class _Client:
    def __init__(self, cfg: ClientConfig) -> None:
        self.cfg = cfg
        u = urlsplit(cfg.url)
        if u.hostname is None:
            raise ValueError(f"no host in {cfg.url}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.authority = f"{self.host}:{self.port}"
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        if cfg.bulk:
            path = f"/bulk/{cfg.bulk}"
        auth = ""
        if cfg.auth:
            auth = f"Proxy-Authorization: Basic {base64.b64encode(cfg.auth.encode()).decode()}\r\n"
        target = f"{'https' if cfg.tls else 'http'}://{self.authority}{path}" if cfg.proxy else path
        body = b"x" * cfg.body_size
        headers = f"Host: {self.authority}\r\nUser-Agent: sandgate-bench\r\n"
        if cfg.proxy:
            headers += auth
        if cfg.body_size or cfg.method in ("POST", "PUT"):
            headers += f"Content-Length: {len(body)}\r\n"
        if cfg.new_conn:
            headers += "Connection: close\r\n"
        self.request = f"{cfg.method} {target} HTTP/1.1\r\n{headers}\r\n".encode() + body
        tunnel = cfg.connect_to or self.authority
        self.connect_request = f"CONNECT {tunnel} HTTP/1.1\r\nHost: {tunnel}\r\n{auth}\r\n".encode()
        self.ssl: ssl.SSLContext | None = None
        if cfg.tls:
            self.ssl = ssl.create_default_context(cafile=cfg.cafile)
            self.ssl.set_alpn_protocols(["http/1.1"])
        self.latencies: list[int] = []
        self.errors = 0
        self.first_error = ""
        self.statuses: dict[str, int] = {}
        self.bytes = 0

    async def open(self) -> _Conn:
        loop = asyncio.get_running_loop()
        transport, conn = await loop.create_connection(_Conn, *self.cfg.address)
        if self.cfg.connect:
            status = await conn.exchange(self.connect_request, head_only=True)
            if status != 200:
                transport.close()
                raise _ResponseError(f"CONNECT answered {status}")
        if self.ssl is not None:
            tls_transport = await loop.start_tls(transport, conn, self.ssl, server_hostname=self.host)
            if tls_transport is None:
                raise ConnectionResetError("TLS handshake: connection closed")
            conn.transport = tls_transport
        return conn

    def _error(self, e: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{type(e).__name__}: {e}"[:300]

    async def worker(self, record_from: int, stop_at: int) -> None:
        conn: _Conn | None = None
        clock = time.perf_counter_ns
        try:
            while True:
                t0 = clock()
                if t0 >= stop_at:
                    return
                if self.cfg.requests and len(self.latencies) >= self.cfg.requests:
                    return
                try:
                    if conn is None:
                        conn = await asyncio.wait_for(self.open(), self.cfg.timeout)
                    status = await asyncio.wait_for(conn.exchange(self.request), self.cfg.timeout)
                    t1 = clock()
                except (OSError, TimeoutError, ssl.SSLError, _ResponseError, ValueError) as e:
                    if t0 >= record_from:
                        self._error(e)
                    if conn is not None and conn.transport is not None:
                        conn.transport.abort()
                    conn = None
                    await asyncio.sleep(0.005)
                    continue
                if t0 >= record_from and t1 <= stop_at:
                    key = str(status)
                    self.statuses[key] = self.statuses.get(key, 0) + 1
                    if 200 <= status < 300:
                        self.latencies.append(t1 - t0)
                    else:
                        self._error(_ResponseError(f"status {status}"))
                self.bytes += conn.body_bytes
                conn.body_bytes = 0
                if self.cfg.new_conn or status >= 400 or conn.transport is None or not conn.reusable:
                    if conn.transport is not None:
                        conn.transport.close()
                    conn = None
        finally:
            if conn is not None and conn.transport is not None:
                conn.transport.close()


async def run(cfg: ClientConfig) -> Result:
    """Run one load and summarise it."""
    client = _Client(cfg)
    if cfg.bulk:
        return await _bulk(client)
    now = time.perf_counter_ns()
    record_from = now + int(cfg.warmup * 1e9)
    stop_at = record_from + int(cfg.duration * 1e9)
    if cfg.requests:
        stop_at = record_from + int(max(cfg.duration, 60) * 1e9)
    elif cfg.marks:
        # Tell a supervising process when the measured window starts and ends (it samples CPU).
        loop = asyncio.get_running_loop()
        loop.call_later(cfg.warmup, _mark, "measure-start")
        loop.call_later(cfg.warmup + cfg.duration, _mark, "measure-end")
    await asyncio.gather(*(client.worker(record_from, stop_at) for _ in range(cfg.concurrency)))
    end = min(time.perf_counter_ns(), stop_at)
    seconds = (end - record_from) / 1e9
    lat = sorted(client.latencies)
    res = Result(
        requests=len(lat),
        errors=client.errors,
        seconds=round(seconds, 3),
        rps=round(len(lat) / seconds, 1) if seconds > 0 else 0.0,
        p50_ms=round(percentile(lat, 50) / 1e6, 3),
        p99_ms=round(percentile(lat, 99) / 1e6, 3),
        max_ms=round((lat[-1] if lat else 0) / 1e6, 3),
        bytes=client.bytes,
        statuses=client.statuses,
        first_error=client.first_error,
    )
    if cfg.requests:
        res.latencies_ms = [round(x / 1e6, 3) for x in client.latencies]
    return res


def _mark(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _bulk(client: _Client) -> Result:
    conn = await asyncio.wait_for(client.open(), client.cfg.timeout)
    try:
        if client.cfg.marks:
            _mark("measure-start")
        t0 = time.perf_counter_ns()
        status = await asyncio.wait_for(conn.exchange(client.request), client.cfg.timeout)
        t1 = time.perf_counter_ns()
        if client.cfg.marks:
            _mark("measure-end")
    finally:
        if conn.transport is not None:
            conn.transport.close()
    seconds = (t1 - t0) / 1e9
    ok = status == 200 and conn.body_bytes == client.cfg.bulk
    return Result(
        requests=1 if ok else 0,
        errors=0 if ok else 1,
        seconds=round(seconds, 3),
        mbps=round(conn.body_bytes / seconds / 1e6, 1) if ok else 0.0,
        bytes=conn.body_bytes,
        statuses={str(status): 1},
        first_error="" if ok else f"status {status}, {conn.body_bytes} of {client.cfg.bulk} bytes",
    )


def _parse_args(argv: list[str] | None) -> ClientConfig:
    p = argparse.ArgumentParser(description="closed-loop HTTP/1.1 load client")
    p.add_argument("--address", required=True, help="host:port to connect to (server or proxy)")
    p.add_argument("--url", required=True)
    p.add_argument("--proxy", action="store_true", help="absolute-form requests (plain HTTP proxy)")
    p.add_argument("--connect", action="store_true", help="CONNECT tunnel to the URL's authority")
    p.add_argument("--connect-to", help="CONNECT to this host:port instead of the URL's authority")
    p.add_argument("--cafile")
    p.add_argument("--auth", help="user:password for Proxy-Authorization")
    p.add_argument("--method", default="GET")
    p.add_argument("--body-size", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--requests", type=int, default=0)
    p.add_argument("--new-conn", action="store_true")
    p.add_argument("--bulk", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--marks", action="store_true", help="print measure-start/-end on stderr")
    a = p.parse_args(argv)
    host, _, port = a.address.rpartition(":")
    return ClientConfig(
        address=(host, int(port)),
        url=a.url,
        proxy=a.proxy,
        connect=a.connect,
        connect_to=a.connect_to,
        tls=a.url.startswith("https:"),
        cafile=a.cafile,
        auth=a.auth,
        method=a.method,
        body_size=a.body_size,
        concurrency=a.concurrency,
        duration=a.duration,
        warmup=a.warmup,
        requests=a.requests,
        new_conn=a.new_conn,
        bulk=a.bulk,
        timeout=a.timeout,
        marks=a.marks,
    )


def main(argv: list[str] | None = None) -> None:
    cfg = _parse_args(argv)
    result = asyncio.run(run(cfg))
    json.dump(asdict(result), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
