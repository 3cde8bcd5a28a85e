"""The SNI of a TLS ClientHello, read strictly and cheaply for the passthrough front.

mitmproxy's `parse_client_hello` builds a kaitaistruct object of the whole message (every
cipher suite, every extension): about a tenth of the front's CPU per new tunnel. The front
needs one thing from it, the server name. This reads exactly that, and only from a ClientHello
laid out as the TLS 1.2/1.3 grammar says: every length agrees with what it covers, no extension
twice, one name of type host_name that mitmproxy also takes for a valid host. Anything else is
`NOT_READABLE`: the front hands the tunnel to mitmproxy, whose own parser and tunnel gate decide
it as they always did. So whatever this accepts, mitmproxy's parser reads the same name from
(tests/proxy/front/test_client_hello.py compares the two on real and mutated hellos).
"""

from __future__ import annotations

import enum
import struct
from typing import Final

from mitmproxy.net.check import is_valid_host
from mitmproxy.proxy.layers.tls import get_client_hello

__all__ = ["INCOMPLETE", "NOT_READABLE", "read_sni"]


class _Outcome(enum.Enum):
    INCOMPLETE = "incomplete"  # not a whole ClientHello yet: read more
    NOT_READABLE = "not readable"  # not one this module reads: mitmproxy's


INCOMPLETE: Final = _Outcome.INCOMPLETE
NOT_READABLE: Final = _Outcome.NOT_READABLE

_CLIENT_HELLO = 1
_SERVER_NAME = 0  # the extension type
_HOST_NAME = 0  # the name type inside it
_FIXED = 2 + 32  # legacy_version, random
_TWO_U16 = struct.Struct("!HH")  # an extension's type and length
_NAME_LIST = struct.Struct("!HBH")  # server_name_list's length, the first name's type and length


class _Malformed(Exception):
    """The message does not follow the grammar (or not strictly enough for the front)."""


def read_sni(data: bytes) -> tuple[str | None] | _Outcome:
    """`(sni,)` (None: no server_name extension) for a whole ClientHello at the start of
    `data` (TLS records); `INCOMPLETE` or `NOT_READABLE` otherwise."""
    try:
        message = get_client_hello(data)
    except ValueError:
        return NOT_READABLE  # a record that is not a handshake record
    if message is None:
        return INCOMPLETE
    try:
        return (_sni(message),)
    except _Malformed:
        return NOT_READABLE


def _sni(message: bytes) -> str | None:
    if message[0] != _CLIENT_HELLO:
        raise _Malformed
    end = len(message)  # the header's length is what get_client_hello cut the message to
    at = 4 + _FIXED
    at = _vector_end(message, at, 1, end, most=32)  # legacy_session_id
    at = _vector_end(message, at, 2, end, least=2, even=True)  # cipher_suites
    at = _vector_end(message, at, 1, end, least=1)  # legacy_compression_methods
    if at == end:
        return None  # no extensions at all (allowed before TLS 1.3)
    if _vector_end(message, at, 2, end) != end:
        raise _Malformed  # bytes after the extensions
    return _server_name(message, at + 2, end)


def _server_name(message: bytes, at: int, end: int) -> str | None:
    """The name in the extensions from `at` to `end`; every extension's bounds checked."""
    seen: set[int] = set()
    sni = None
    while at < end:
        if at + 4 > end:
            raise _Malformed
        kind, length = _TWO_U16.unpack_from(message, at)
        value_end = at + 4 + length
        if value_end > end or kind in seen:
            raise _Malformed  # a duplicate: servers refuse it, readers may disagree on which counts
        seen.add(kind)
        if kind == _SERVER_NAME:
            sni = _host_name(message[at + 4 : value_end])
        at = value_end
    return sni


def _host_name(value: bytes) -> str:
    """The one host_name of a server_name extension's value."""
    if len(value) < 5:
        raise _Malformed
    list_length, name_type, name_length = _NAME_LIST.unpack_from(value)
    if list_length + 2 != len(value) or name_type != _HOST_NAME or name_length + 5 != len(value):
        raise _Malformed  # not exactly one name, of type host_name
    name = value[5:]
    if not is_valid_host(name):
        raise _Malformed  # mitmproxy skips such a name: its reading, not this one, decides
    return name.decode("ascii")


def _vector_end(
    data: bytes, at: int, width: int, end: int, *, least: int = 0, most: int = 1 << 16, even: bool = False
) -> int:
    """Where the variable-length vector at `at` (its length in `width` bytes) ends,
    checking it fits before `end` and its length's bounds."""
    start = at + width
    if start > end:
        raise _Malformed
    length = int.from_bytes(data[at:start])
    if start + length > end or not least <= length <= most or (even and length % 2):
        raise _Malformed
    return start + length
