"""Handing a connection to mitmproxy: the bytes read put back first, a repeated answer swallowed."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from sandgate.proxy.front.handoff import SwallowedAnswer, hand_off, self_test


def test_the_stream_buffer_is_where_the_handoff_puts_bytes_back() -> None:
    self_test()


async def _pair() -> tuple[asyncio.StreamReader, asyncio.StreamWriter, socket.socket]:
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    theirs.setblocking(False)
    return reader, writer, theirs


async def _received(peer: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while chunk := await asyncio.wait_for(loop.sock_recv(peer, 65536), 5):
        data += chunk
    return data


async def test_the_handler_reads_the_replayed_bytes_before_the_rest() -> None:
    reader, writer, peer = await _pair()
    seen: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: Any) -> None:
        seen.append(await r.readexactly(len(b"CONNECT-HEADrest")))
        w.close()

    peer.send(b"rest")
    await asyncio.sleep(0.05)
    await hand_off(reader, writer, b"CONNECT-HEAD", False, handler)
    assert seen == [b"CONNECT-HEADrest"]
    peer.close()


async def test_a_2xx_answer_is_swallowed_and_what_follows_it_passes() -> None:
    _reader, writer, peer = await _pair()
    swallowing = SwallowedAnswer(writer)
    swallowing.write(b"HTTP/1.1 200 Connection ")
    swallowing.write(b"established\r\n\r\nHTTP/1.1 200 OK\r\n")
    swallowing.write(b"Content-Length: 0\r\n\r\n")
    await swallowing.drain()
    writer.close()
    assert await _received(peer) == b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    peer.close()


async def test_a_refusal_after_the_fronts_200_closes_the_connection_and_sends_nothing() -> None:
    _reader, writer, peer = await _pair()
    swallowing = SwallowedAnswer(writer)
    swallowing.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno")
    assert writer.is_closing()
    assert swallowing.is_closing(), "the wrapper answers for the writer it wraps"
    loop = asyncio.get_running_loop()
    data = b""
    try:
        while chunk := await asyncio.wait_for(loop.sock_recv(peer, 65536), 5):
            data += chunk
    except ConnectionResetError:
        pass
    assert data == b""
    peer.close()
