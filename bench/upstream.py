"""A fast loopback HTTP/1.1 upstream for the benchmark: plain and TLS listeners, one process.

`tests/support/upstream.py` (RecordingUpstream) records every request and parses with
StreamReader; over a 10 s run at tens of thousands of requests that record grows without
bound and the parser, not the proxy, sets the ceiling of the "direct" row. This server
records nothing and answers from an asyncio Protocol:

- any path: `200`, `Content-Length: 3`, body `ok\\n` (request bodies are read and dropped);
- `/bulk/<n>`: `200` with an n-byte body, written in 256 KiB slices under flow control.

Run: `python bench/upstream.py --host 127.0.0.2 --cert C --key K`; it prints one JSON line
`{"http_port": P, "tls_port": Q}` and serves until SIGTERM/SIGINT or stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import ssl
import sys

__all__ = ["serve"]

_SMALL = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n"
_BAD = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_SLICE = 256 * 1024
_MAX_HEAD = 64 * 1024


class _Http(asyncio.Protocol):
    """One connection: pipelined-safe request parsing, bodies skipped by Content-Length."""

    __slots__ = ("_body_left", "_buf", "_can_write", "_close_after", "_streaming", "_transport")

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._body_left = 0
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._streaming = False
        self._close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._can_write.set()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self._process()

    def _process(self) -> None:
        while self._transport is not None and not self._streaming:
            if self._body_left:
                n = min(self._body_left, len(self._buf))
                del self._buf[:n]
                self._body_left -= n
                if self._body_left:
                    return
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD:
                    self._fail()
                return
            head = bytes(self._buf[:end]).decode("latin-1")
            del self._buf[: end + 4]
            lines = head.lstrip("\r\n").split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) != 3:
                self._fail()
                return
            length, close = 0, parts[2] == "HTTP/1.0"
            for line in lines[1:]:
                name, _, value = line.partition(":")
                lname = name.strip().lower()
                if lname == "content-length":
                    length = int(value.strip())
                elif lname == "connection":
                    tokens = {t.strip().lower() for t in value.split(",")}
                    close = "close" in tokens or (parts[2] == "HTTP/1.0" and "keep-alive" not in tokens)
                elif lname == "transfer-encoding":
                    self._fail()  # the benchmark never sends chunked bodies
                    return
            self._body_left = length
            path = parts[1]
            if "/bulk/" in path:
                size = int(path.rsplit("/", 1)[1])
                self._streaming = True
                self._close_after = close
                asyncio.get_running_loop().create_task(self._stream(size))
                return
            self._transport.write(_SMALL)
            if close:
                self._transport.close()
                return

    async def _stream(self, size: int) -> None:
        transport = self._transport
        if transport is None:
            return
        transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            + f"Content-Length: {size}\r\n\r\n".encode()
        )
        chunk = b"\0" * _SLICE
        view = memoryview(chunk)
        left = size
        while left > 0 and self._transport is not None:
            await self._can_write.wait()
            n = min(left, _SLICE)
            transport.write(view[:n] if n < _SLICE else chunk)
            left -= n
        self._streaming = False
        if self._close_after and self._transport is not None:
            self._transport.close()
        elif self._buf:
            self._process()

    def _fail(self) -> None:
        if self._transport is not None:
            self._transport.write(_BAD)
            self._transport.close()


async def serve(host: str, cert: str | None, key: str | None, ready: asyncio.Future[dict[str, int]]) -> None:
    """Serve until cancelled; `ready` gets the bound ports."""
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(_Http, host, 0, backlog=4096)]
    ports = {"http_port": servers[0].sockets[0].getsockname()[1]}
    if cert and key:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        ctx.set_alpn_protocols(["http/1.1"])
        servers.append(await loop.create_server(_Http, host, 0, ssl=ctx, backlog=4096))
        ports["tls_port"] = servers[1].sockets[0].getsockname()[1]
    ready.set_result(ports)
    try:
        await asyncio.Event().wait()
    finally:
        for s in servers:
            s.close()


async def _main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[dict[str, int]] = loop.create_future()
    task = loop.create_task(serve(args.host, args.cert, args.key, ready))
    ports = await ready
    print(json.dumps(ports), flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # stdin closing (the parent died) also stops the server.
    stdin = sys.stdin.fileno()
    loop.add_reader(stdin, lambda: stop.set() if not os.read(stdin, 4096) else None)
    await stop.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.2")
    p.add_argument("--cert")
    p.add_argument("--key")
    asyncio.run(_main(p.parse_args()))


if __name__ == "__main__":
    main()
