"""The front's ClientHello reader: what it accepts, mitmproxy's parser reads the same name from."""

from __future__ import annotations

import contextlib
import itertools
import ssl
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mitmproxy.proxy.layers.tls import parse_client_hello

from sandgate.proxy.front.client_hello import INCOMPLETE, NOT_READABLE, read_sni


def real_hello(sni: str | None, *, tls12: bool = False) -> bytes:
    """The TLS records of a real ClientHello (Python's OpenSSL client) naming `sni`."""
    context = ssl.create_default_context()
    context.check_hostname = False
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    outgoing = ssl.MemoryBIO()
    conn = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=sni)
    with contextlib.suppress(ssl.SSLWantReadError):
        conn.do_handshake()
    return outgoing.read()


def handshake_of(records: bytes) -> bytes:
    """The handshake message inside one record."""
    return records[5 : 5 + struct.unpack("!H", records[3:5])[0]]


def in_records(message: bytes, *cuts: int) -> bytes:
    """`message` as handshake records, split at `cuts`."""
    bounds = [0, *cuts, len(message)]
    return b"".join(
        b"\x16\x03\x01" + struct.pack("!H", b - a) + message[a:b] for a, b in itertools.pairwise(bounds)
    )


def hello_message(extensions: list[tuple[int, bytes]], *, trailing: bytes = b"") -> bytes:
    """A hand-made ClientHello handshake message with these extensions."""
    exts = b"".join(struct.pack("!HH", kind, len(value)) + value for kind, value in extensions)
    body = b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body += struct.pack("!H", len(exts)) + exts + trailing
    return b"\x01" + len(body).to_bytes(3) + body


def server_name(*names: bytes, name_type: int = 0) -> tuple[int, bytes]:
    entries = b"".join(bytes([name_type]) + struct.pack("!H", len(n)) + n for n in names)
    return 0, struct.pack("!H", len(entries)) + entries


def mitmproxy_sni(data: bytes) -> str | None:
    parsed = parse_client_hello(data)
    assert parsed is not None
    return parsed.sni


@pytest.mark.parametrize("sni", ["api.test", "a.b.example.com", "x" * 63 + ".test", None])
@pytest.mark.parametrize("tls12", [False, True])
def test_a_real_hello_gives_the_name_mitmproxy_reads(sni: str | None, tls12: bool) -> None:
    data = real_hello(sni, tls12=tls12)
    assert read_sni(data) == (sni,)
    assert mitmproxy_sni(data) == sni


def test_a_hello_split_over_records_and_reads_is_read_once_whole() -> None:
    data = real_hello("api.test")
    message = handshake_of(data)
    split = in_records(message, 3, 40, 200)
    assert read_sni(split) == ("api.test",) == (mitmproxy_sni(split),)
    for cut in (1, 5, 9, len(split) - 1):
        assert read_sni(split[:cut]) is INCOMPLETE
    # What follows the hello (early data) is not its concern.
    assert read_sni(data + b"\x17\x03\x03\x00\x01x") == ("api.test",)


@pytest.mark.parametrize(
    ("why", "message"),
    [
        ("two server_name extensions", hello_message([server_name(b"a.test"), server_name(b"b.test")])),
        ("two names in one", hello_message([server_name(b"a.test", b"b.test")])),
        ("a name of another type", hello_message([server_name(b"a.test", name_type=1)])),
        ("not a host name", hello_message([server_name(b"a test")])),
        ("bytes after the extensions", hello_message([server_name(b"a.test")], trailing=b"\x00")),
        ("a duplicate of another extension", hello_message([(16, b"\x00\x00"), (16, b"\x00\x00")])),
        ("a server hello", b"\x02" + hello_message([server_name(b"a.test")])[1:]),
    ],
)
def test_an_unusual_hello_is_left_to_mitmproxy(why: str, message: bytes) -> None:
    assert read_sni(in_records(message)) is NOT_READABLE, why


def test_a_hand_made_hello_with_one_name_and_none_at_all() -> None:
    assert read_sni(in_records(hello_message([server_name(b"api.test"), (16, b"\x00\x00")]))) == ("api.test",)
    assert read_sni(in_records(hello_message([(16, b"\x00\x00")]))) == (None,)
    assert read_sni(b"\x17\x03\x03\x00\x05hello") is NOT_READABLE  # application data, not a handshake


_BASE = real_hello("api.test")


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=5, max_value=len(_BASE) - 1), st.integers(min_value=0, max_value=255)
        ),
        min_size=1,
        max_size=4,
    ),
    st.integers(min_value=0, max_value=len(_BASE)),
)
def test_whatever_it_reads_from_a_mutated_hello_mitmproxy_reads_the_same(
    flips: list[tuple[int, int]], keep: int
) -> None:
    data = bytearray(_BASE)
    for at, value in flips:
        data[at] = value
    mutated = bytes(data[: max(keep, 5)])
    got = read_sni(mutated)
    if isinstance(got, tuple):
        assert mitmproxy_sni(mutated) == got[0]
