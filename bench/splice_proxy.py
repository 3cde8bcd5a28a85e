"""A minimal asyncio CONNECT proxy: the ceiling of a passthrough path outside mitmproxy's layers.

Not sandgate, and never run in front of guests: one Basic credential, a host allowlist and a
static name map stand in for identity, policy and the resolver; nothing is audited. What it
does per tunnel is what such a path must do at the least: read the CONNECT head (8 KiB cap,
10 s), check the credential and the target, connect, answer 200, read the ClientHello and
parse its SNI with mitmproxy's parser, then splice the two sockets with asyncio Protocols
(no streams, no per-chunk hooks). bench/workers.py's `splice` phase measures it beside the
gateway and squid, so the gap a passthrough fast path could close is a figure, not a guess.

Run: `python bench/splice_proxy.py --listen 127.0.0.1:0 --auth u:p --map pass.api.test=127.0.0.2`
(prints `{"port": N}` once listening).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hmac
import json
import sys

from mitmproxy.tls import ClientHello

HEAD_LIMIT = 8 * 1024
HEAD_TIMEOUT = 10.0
TLS_RECORD_HEADER = 5


class Pipe(asyncio.Protocol):
    """One direction's reader: what it receives is written to `peer` (back-pressure both ways)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: asyncio.Transport | None = None
        self.writer: asyncio.StreamWriter | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.peer is not None:
            self.peer.write(data)

    def eof_received(self) -> bool:
        if self.peer is not None and self.peer.can_write_eof():
            self.peer.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()

    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.resume_reading()


async def handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, auth: bytes, names: dict[str, str]
) -> None:
    loop = asyncio.get_running_loop()
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        lines = head.decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ", 2)
        credential = b""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "proxy-authorization":
                scheme, _, token = value.strip().partition(" ")
                if scheme.lower() == "basic":
                    credential = base64.b64decode(token, validate=True)
        host, _, port_text = target.rpartition(":")
        address = names.get(host.lower())
        if method != "CONNECT" or address is None or not hmac.compare_digest(credential, auth):
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        record_head = await asyncio.wait_for(reader.readexactly(TLS_RECORD_HEADER), HEAD_TIMEOUT)
        length = int.from_bytes(record_head[3:5], "big")
        body = await asyncio.wait_for(reader.readexactly(length), HEAD_TIMEOUT)
        if record_head[0] != 0x16 or ClientHello(body[4:]).sni != host.lower():
            writer.close()
            return
        upstream, up_pipe = await loop.create_connection(Pipe, address, int(port_text))
    except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        writer.close()
        return
    # Take the client's transport over from the stream machinery: its bytes go to the upstream.
    client = writer.transport
    assert isinstance(client, asyncio.Transport)
    down_pipe = Pipe()
    # Held for the tunnel's life: a StreamWriter that is collected closes its transport.
    down_pipe.writer = writer
    down_pipe.transport = client
    down_pipe.peer = upstream
    up_pipe.peer = client
    upstream.write(record_head + body)
    buffered = bytes(reader._buffer)  # a benchmark: what the stream read past the hello
    if buffered:
        upstream.write(buffered)
    client.set_protocol(down_pipe)


async def serve(listen: str, auth: bytes, names: dict[str, str]) -> None:
    host, _, port = listen.rpartition(":")
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, auth, names), host, int(port), limit=HEAD_LIMIT, backlog=1024
    )
    sockname = server.sockets[0].getsockname()
    print(json.dumps({"port": sockname[1]}), flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, help="host:port (port 0: any free port)")
    p.add_argument("--auth", required=True, help="user:password every CONNECT must carry")
    p.add_argument("--map", action="append", default=[], help="name=address, the only names allowed")
    a = p.parse_args(argv)
    names = dict(item.split("=", 1) for item in a.map)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(a.listen, a.auth.encode(), names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
