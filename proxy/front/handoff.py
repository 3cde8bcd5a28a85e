"""Handing a connection the front has read from to mitmproxy, as if mitmproxy had read it all.

The bytes the front read go back to the front of the stream's buffer, so mitmproxy's reader
gets them first. When the guest already has the front's 200 for its CONNECT (its tunnel
turned out not to carry a ClientHello the front reads), mitmproxy is given the CONNECT again
and its own answer to it is swallowed: a 2xx is dropped (the guest has one), anything else
means mitmproxy refused after all, and the connection is closed without a word more.

`asyncio.StreamReader._buffer` is not an API: `self_test()` checks it at start-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

__all__ = ["SwallowedAnswer", "hand_off", "self_test", "stream_buffer"]

log = structlog.get_logger("sandgate.front")

_HEAD_END = b"\r\n\r\n"
# mitmproxy's answer to a CONNECT is a head with no body; anything longer is not that answer.
_ANSWER_MAX = 16 * 1024


def stream_buffer(reader: asyncio.StreamReader) -> bytearray:
    """The bytes the stream has read from its socket and not handed out yet (the object itself)."""
    buffer = vars(reader).get("_buffer")
    if not isinstance(buffer, bytearray):
        raise RuntimeError("asyncio.StreamReader moved its buffer")
    return buffer


def self_test() -> None:
    """Raise RuntimeError when asyncio's StreamReader no longer keeps its bytes where this reads."""
    loop = asyncio.new_event_loop()  # a reader needs one; the caller's may not be running yet
    try:
        reader = asyncio.StreamReader(loop=loop)
        reader.feed_data(b"x")
        buffer = vars(reader).get("_buffer")
    finally:
        loop.close()
    if not isinstance(buffer, bytearray) or bytes(buffer) != b"x":
        raise RuntimeError("asyncio.StreamReader moved its buffer: the passthrough front cannot hand off")


async def hand_off(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    replay: bytes,
    answered: bool,
    handler: Callable[[asyncio.StreamReader, Any], Awaitable[None]],
) -> None:
    """Run mitmproxy's stream handler on the connection, `replay` first in its reader."""
    if replay:
        stream_buffer(reader)[:0] = replay
    await handler(reader, SwallowedAnswer(writer) if answered else writer)


class SwallowedAnswer:
    """A StreamWriter whose first HTTP answer is withheld (the front already answered the CONNECT)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._head = bytearray()
        self._swallowing = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._swallowing:
            self._writer.write(data)
            return
        self._head += data
        end = self._head.find(_HEAD_END)
        if end < 0:
            if len(self._head) > _ANSWER_MAX:
                self._refused()
            return
        status_line = bytes(self._head[: self._head.find(b"\r\n")])
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[1].startswith(b"2"):
            self._refused()
            return
        rest = bytes(self._head[end + len(_HEAD_END) :])
        self._swallowing = False
        self._head.clear()
        if rest:
            self._writer.write(rest)

    def _refused(self) -> None:
        # mitmproxy refused the CONNECT the front allowed (a policy changed in between): its
        # record says so; the guest, which has a 200 already, only sees the connection close.
        log.info("front.handoff_refused")
        self._swallowing = False
        self._head.clear()
        self._writer.transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)
