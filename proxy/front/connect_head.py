"""The first request head of a connection, read for the passthrough front: a plain CONNECT or nothing.

Strict on purpose: anything but a simple `CONNECT authority HTTP/1.x` with well-formed header
lines (one Proxy-Authorization at most, no body framing, ASCII only, within the head caps) is
left to mitmproxy, whose layers and addons answer it as they answer every request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["HEAD_END", "ConnectHead", "looks_like_connect", "read_connect_head"]

HEAD_END = b"\r\n\r\n"
_PREFIX = b"CONNECT "
_REQUEST_LINE = re.compile(rb"CONNECT ([!-~]+) (HTTP/1\.[01])")
_HEADER_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([ -~\t]*?)[ \t]*")
# A CONNECT with a body, or asking to switch protocols, is not a plain tunnel request.
_NOT_PLAIN = frozenset({b"content-length", b"transfer-encoding", b"upgrade", b"expect"})


@dataclass(frozen=True, slots=True)
class ConnectHead:
    """A plain CONNECT: its target, its credential, its HTTP version and its size in bytes."""

    authority: str
    http_version: str
    proxy_authorization: str | None
    size: int

    def __repr__(self) -> str:
        # Never the credential: a repr ends up in logs.
        return f"ConnectHead(authority={self.authority!r}, http_version={self.http_version!r})"


def looks_like_connect(data: bytes) -> bool:
    """Whether the bytes so far may still be a CONNECT request (a prefix of one, or one)."""
    n = min(len(data), len(_PREFIX))
    return data[:n] == _PREFIX[:n]


def read_connect_head(data: bytes, *, max_bytes: int, max_lines: int) -> ConnectHead | None:
    """The plain CONNECT at the start of `data` (which holds the whole head), or None."""
    end = data.find(HEAD_END)
    if end < 0 or end + len(HEAD_END) > max_bytes:
        return None
    lines = data[:end].split(b"\r\n")
    if len(lines) > max_lines:
        return None
    request = _REQUEST_LINE.fullmatch(lines[0])
    if request is None:
        return None
    credential: str | None = None
    for line in lines[1:]:
        header = _HEADER_LINE.fullmatch(line)
        if header is None:
            return None  # obs-fold, bare CR, a byte outside ASCII, no colon: mitmproxy's to answer
        name = header.group(1).lower()
        if name in _NOT_PLAIN:
            return None
        if name == b"proxy-authorization":
            if credential is not None:
                return None  # two credentials: which one names the sandbox is not ours to guess
            credential = header.group(2).decode("ascii")
    return ConnectHead(
        authority=request.group(1).decode("ascii"),
        http_version=request.group(2).decode("ascii"),
        proxy_authorization=credential,
        size=end + len(HEAD_END),
    )
