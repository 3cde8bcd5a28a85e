"""Who is at the other end of a guest connection, as plain functions the addons and the
passthrough front both call: the proxy credential it sent, its address as records show it and
as the per-source cap counts it, and whether bytes it sent wait unread (then it is not idle).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import fcntl
import ipaddress
import struct
import termios
from typing import Any

__all__ = [
    "RECLAIM_AFTER_SECONDS",
    "client_address",
    "parse_proxy_authorization",
    "peer_ip",
    "source_key",
    "stream_buffer_of",
    "unread",
]

# A connection quiet for less than this is not idle for eviction: it may be about to send.
RECLAIM_AFTER_SECONDS = 1.0


def parse_proxy_authorization(value: str | None) -> tuple[str, str] | None:
    """(sandbox id, token) from a Basic Proxy-Authorization value, or None."""
    if not value:
        return None
    scheme, _, encoded = value.strip().partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, token = decoded.partition(":")
    return (user, token) if sep and user and token else None


def client_address(peer: tuple[str, int] | object | None) -> str:
    """`host:port` (`[v6]:port`) of a peer address as records show it; `-` when unknown."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return "-"


def peer_ip(peer: tuple[Any, ...] | object | None) -> str | None:
    """The IP address of a peer (as the policy's `client` sees it), or None when unknown."""
    return str(peer[0]) if isinstance(peer, tuple) and peer else None


def source_key(peer: tuple[Any, ...] | None) -> str:
    """The address a per-source cap counts: the IPv4 address, or the IPv6 /64 (one host's usual share)."""
    if not peer:
        return "-"
    try:
        addr = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return str(peer[0])
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


def unread(reader: object, writer: object) -> bool:
    """Whether bytes the client sent wait unread (asyncio's stream buffer, the socket's queue).
    True when it cannot be told: such a connection is never taken for an idle one."""
    try:
        if isinstance(reader, asyncio.StreamReader) and stream_buffer_of(reader):
            return True
        sock = writer.get_extra_info("socket")  # type: ignore[attr-defined]
        queued = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (AttributeError, OSError, RuntimeError, ValueError):
        return True
    return bool(struct.unpack("i", queued)[0] > 0)


def stream_buffer_of(reader: asyncio.StreamReader) -> bytearray:
    """What the stream read from its socket and has not handed out (asyncio's private buffer,
    which the passthrough front reads too; connection_limits.check_seams checks it is there)."""
    buffer = vars(reader).get("_buffer")
    if not isinstance(buffer, bytearray):
        raise RuntimeError("asyncio.StreamReader moved its buffer")
    return buffer
