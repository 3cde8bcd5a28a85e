"""Tests for sandgate.policy.hosts: canonical hosts and authorities (paths: test_paths.py)."""

from __future__ import annotations

import re
from ipaddress import IPv4Address, IPv6Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy.errors import HostError
from sandgate.policy.hosts import (
    normalise_host,
    parse_ip_literal,
    split_authority,
)

PROPERTY = settings(max_examples=150, deadline=None)

# --- normalise_host: accepted ---------------------------------------------------------

HOSTS_OK = [
    ("example.com", "example.com", "a plain name is unchanged"),
    ("WWW.Example.COM", "www.example.com", "upper case is folded to lower case"),
    ("LOCALHOST.", "localhost", "one trailing dot is dropped and the case folded"),
    ("ex\u00e4mple.com", "xn--exmple-cua.com", "a unicode label becomes its a-label"),
    ("EX\u00c4MPLE.com", "xn--exmple-cua.com", "an upper case unicode label maps to the same"),
    ("xn--exmple-cua.com", "xn--exmple-cua.com", "a canonical a-label is kept"),
    ("XN--EXMPLE-CUA.com", "xn--exmple-cua.com", "an upper case a-label is folded"),
    ("stra\u00dfe.de", "xn--strae-oqa.de", "sharp s is kept, not mapped to ss"),
    ("_dmarc.example.com", "_dmarc.example.com", "an underscore is allowed in a label"),
    ("a--b.example", "a--b.example", "double hyphens inside a label are allowed"),
    ("1.2.3.example", "1.2.3.example", "numeric labels before a name make a hostname"),
    ("%65xample.com", "example.com", "percent-escapes are decoded before anything else"),
    ("ex%C3%A4mple.com", "xn--exmple-cua.com", "percent-encoded utf-8 is decoded then idna"),
    ("\uff45xample\u3002com", "example.com", "fullwidth letters and ideographic dots are mapped"),
    ("2130706433", "127.0.0.1", "a decimal integer is an ipv4 address"),
    ("0x7f000001", "127.0.0.1", "a hex integer is an ipv4 address"),
    ("017700000001", "127.0.0.1", "an octal integer is an ipv4 address"),
    ("0x7f.1", "127.0.0.1", "a hex part then a 24-bit part is an ipv4 address"),
    ("127.1", "127.0.0.1", "two parts are an ipv4 address"),
    ("127.0.1", "127.0.0.1", "three parts are an ipv4 address"),
    ("0177.0.0.01", "127.0.0.1", "octal parts are an ipv4 address"),
    ("0x7F.0X0.00.1", "127.0.0.1", "mixed radix with upper case prefixes is an ipv4 address"),
    ("127.0.0.1.", "127.0.0.1", "a trailing dot on an ipv4 address is dropped"),
    ("%31%32%37.0.0.1", "127.0.0.1", "a percent-encoded ipv4 address is decoded"),
    ("\uff11\uff12\uff17.0.0.1", "127.0.0.1", "fullwidth digits are an ipv4 address"),
    ("0", "0.0.0.0", "a bare zero is the unspecified address"),
    ("0x", "0.0.0.0", "a bare hex prefix is zero"),
    ("4294967295", "255.255.255.255", "the largest 32-bit integer is the broadcast address"),
    ("[::1]", "::1", "a bracketed ipv6 address loses its brackets"),
    ("::1", "::1", "a bare ipv6 address is accepted"),
    ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1", "an ipv4-mapped address keeps dotted form"),
    ("[::ffff:7f00:1]", "::ffff:127.0.0.1", "an ipv4-mapped address in hex gets dotted form"),
    ("[2001:DB8:0:0:0:0:0:1]", "2001:db8::1", "ipv6 is compressed and lower case"),
    ("[fd00:ec2::254]", "fd00:ec2::254", "the aws ipv6 metadata address is kept as is"),
]


@pytest.mark.parametrize(("raw", "expected"), [c[:2] for c in HOSTS_OK], ids=[c[2] for c in HOSTS_OK])
def test_normalise_host_accepts(raw: str, expected: str) -> None:
    assert normalise_host(raw) == expected


# --- normalise_host: refused ----------------------------------------------------------

HOSTS_BAD = [
    ("", "host is empty", "an empty host is refused"),
    ("*", "'*' is not a host", "a bare wildcard is refused"),
    ("*.example.com", "contains '*'", "a wildcard label is refused"),
    (" example.com", "surrounding whitespace", "leading whitespace is refused, not stripped"),
    ("example.com\n", "surrounding whitespace", "a trailing newline is refused, not stripped"),
    ("exa mple.com", "whitespace or a control", "inner whitespace is refused"),
    ("exa%20mple.com", "whitespace or a control", "encoded whitespace is refused"),
    ("example.com\x00.evil", "NUL", "a raw nul is refused"),
    ("example.com%00.evil", "NUL", "an encoded nul is refused"),
    ("example.com/x", "'/'", "a slash is refused"),
    ("example.com%2fx", "'/'", "an encoded slash is refused"),
    ("\uff0fexample.com", "'/'", "a fullwidth solidus that maps to a slash is refused"),
    ("example.com\\x", "backslash", "a backslash is refused"),
    ("user@example.com", "'@'", "userinfo is refused"),
    ("example.com:80", "':' outside an IPv6", "a port is refused"),
    ("example.com%3a80", "':' outside an IPv6", "an encoded colon is refused"),
    ("fe80::1%eth0", "zone ids", "a zone id is refused"),
    ("fe80::1%25eth0", "zone ids", "a percent-encoded zone id is refused"),
    ("[fe80::1%25eth0]", "zone ids", "a bracketed zone id is refused"),
    ("[127.0.0.1]", "not a valid IPv6", "ipv4 in brackets is refused"),
    ("[::1", "unterminated", "an unterminated bracket is refused"),
    ("%zz.example", "invalid percent-escape", "an invalid percent-escape is refused"),
    ("%ff.example", "invalid UTF-8", "percent-encoded invalid utf-8 is refused"),
    ("%2531.0.0.1", "'%'", "a double-encoded host is refused"),
    ("exa\u00admple.com", "ignorable code point U+00AD", "a soft hyphen is refused"),
    ("exa\u200bmple.com", "ignorable code point U+200B", "a zero width space is refused"),
    ("1.2.3.4.5", "more than four parts", "five numeric parts are refused"),
    ("999.1.1.1", "out of range", "a part above 255 is refused"),
    ("1.2.3.256", "out of range", "a last part above 255 is refused"),
    ("1.16777216", "out of range", "a 24-bit last part above its range is refused"),
    ("1.2.65536", "out of range", "a 16-bit last part above its range is refused"),
    ("4294967296", "out of range", "an integer above 32 bits is refused"),
    ("0x1g.1", "not a valid IPv4", "a bad hex part before a number is refused"),
    ("08.1.1.1", "not a valid IPv4", "an invalid octal part is refused"),
    ("example.123", "not a valid IPv4", "a name ending in a number is refused"),
    ("example.0x7f", "not a valid IPv4", "a name ending in a hex number is refused"),
    ("1..1", "not a valid IPv4", "an empty part in an ipv4 address is refused"),
    ("a..b", "empty label", "an empty label is refused"),
    (".", "empty label", "a lone dot is refused"),
    ("example.com..", "empty label", "two trailing dots are refused"),
    ("-a.example", "starts or ends with '-'", "a leading hyphen is refused"),
    ("a-.example", "starts or ends with '-'", "a trailing hyphen is refused"),
    ("a" * 64 + ".example", "longer than 63", "a 64-character label is refused"),
    (".".join(["a" * 63] * 4), "longer than 253", "a 255-character host is refused"),
    ("xn--abc-.example", "invalid xn--", "a broken a-label is refused"),
    ("xn---bbk.example", "invalid xn--", "a non-canonical a-label is refused"),
    ("a!b.example", "not allowed in a label", "punctuation in a label is refused"),
    ("\u2603_x.example", "not valid IDNA", "an underscore in a unicode label is refused"),
]


@pytest.mark.parametrize(("raw", "problem"), [c[:2] for c in HOSTS_BAD], ids=[c[2] for c in HOSTS_BAD])
def test_normalise_host_refuses(raw: str, problem: str) -> None:
    with pytest.raises(HostError, match=re.escape(problem)):
        normalise_host(raw)


def test_host_error_echoes_at_most_a_prefix_of_a_long_host() -> None:
    raw = "a" * 300 + "/"
    with pytest.raises(HostError) as caught:
        normalise_host(raw)
    assert len(str(caught.value)) < 150


# --- parse_ip_literal -----------------------------------------------------------------

IP_LITERALS = [
    ("example.com", None, "a hostname is not an ip literal"),
    ("1.2.3.example", None, "numeric labels before a name are not an ip literal"),
    ("2130706433", IPv4Address("127.0.0.1"), "a decimal integer is read as ipv4"),
    ("0x7f.1", IPv4Address("127.0.0.1"), "a hex first part is read as ipv4"),
    ("127.0.0.1.", IPv4Address("127.0.0.1"), "a trailing dot is allowed"),
    ("%31%32%37.0.0.1", IPv4Address("127.0.0.1"), "percent-escapes are decoded"),
    ("[::1]", IPv6Address("::1"), "a bracketed ipv6 address is read"),
    ("::ffff:7f00:1", IPv6Address("::ffff:127.0.0.1"), "a bare ipv6 address is read"),
    ("example.com:80", None, "a name with a port is not an ip literal"),
]


@pytest.mark.parametrize(("host", "expected"), [c[:2] for c in IP_LITERALS], ids=[c[2] for c in IP_LITERALS])
def test_parse_ip_literal(host: str, expected: IPv4Address | IPv6Address | None) -> None:
    assert parse_ip_literal(host) == expected


IP_LITERALS_BAD = [
    ("1.2.3.4.5", "a name that ends in a number but has five parts is an error"),
    ("999.1.1.1", "a part out of range is an error"),
    ("0x1g.1", "a bad hex part is an error"),
    ("[127.0.0.1]", "brackets around ipv4 are an error"),
    ("fe80::1%eth0", "a zone id is an error"),
]


@pytest.mark.parametrize("host", [c[0] for c in IP_LITERALS_BAD], ids=[c[1] for c in IP_LITERALS_BAD])
def test_parse_ip_literal_refuses(host: str) -> None:
    with pytest.raises(HostError):
        parse_ip_literal(host)


# --- split_authority ------------------------------------------------------------------

AUTHORITIES = [
    ("example.com", 443, ("example.com", 443), "a bare host takes the default port"),
    ("Example.COM:8443", 443, ("example.com", 8443), "an explicit port is used"),
    ("[::1]", 80, ("::1", 80), "a bracketed ipv6 host takes the default port"),
    ("[::1]:8080", 80, ("::1", 8080), "a bracketed ipv6 host with a port"),
    ("2130706433:80", 443, ("127.0.0.1", 80), "an integer ipv4 host is normalised"),
    ("example.com:65535", 80, ("example.com", 65535), "the highest port is allowed"),
    ("example.com:08080", 80, ("example.com", 8080), "a leading zero in a port is decimal"),
]


@pytest.mark.parametrize(
    ("authority", "default", "expected"),
    [c[:3] for c in AUTHORITIES],
    ids=[c[3] for c in AUTHORITIES],
)
def test_split_authority(authority: str, default: int, expected: tuple[str, int]) -> None:
    assert split_authority(authority, default) == expected


AUTHORITIES_BAD = [
    ("", "authority is empty", "an empty authority is refused"),
    ("user:secret@example.com", "userinfo", "userinfo is refused"),
    ("user%3Asecret%40example.com", "userinfo", "encoded userinfo is refused"),
    ("example.com:", "1 to 5 digits", "an empty port is refused"),
    ("example.com:0", "out of range", "port zero is refused"),
    ("example.com:65536", "out of range", "a port above 65535 is refused"),
    ("example.com:123456", "1 to 5 digits", "a six-digit port is refused"),
    ("example.com:+80", "1 to 5 digits", "a signed port is refused"),
    ("example.com:\u0668\u0660", "1 to 5 digits", "non-ascii digits in a port are refused"),
    ("example.com:80:90", "must be in brackets", "two colons without brackets are refused"),
    ("::1", "must be in brackets", "a bare ipv6 authority is refused"),
    ("[::1]x", "junk after", "junk after the bracket is refused"),
    ("[::1", "unterminated", "an unterminated bracket is refused"),
    ("exa mple.com:80", "whitespace", "a bad host is refused"),
]


@pytest.mark.parametrize(
    ("authority", "problem"), [c[:2] for c in AUTHORITIES_BAD], ids=[c[2] for c in AUTHORITIES_BAD]
)
def test_split_authority_refuses(authority: str, problem: str) -> None:
    with pytest.raises(HostError, match=re.escape(problem)):
        split_authority(authority, 80)


def test_split_authority_never_echoes_userinfo() -> None:
    with pytest.raises(HostError) as caught:
        split_authority("user:hunter2@example.com:443", 443)
    assert "hunter2" not in str(caught.value)


# --- properties -----------------------------------------------------------------------

_LABEL_CHARS = "abcXYZ019-_\u00e4\u00df\u00c4\uff41\uff11"
_labels = st.text(alphabet=_LABEL_CHARS, min_size=1, max_size=12)
_names = st.lists(_labels, min_size=1, max_size=4).map(".".join)
_host_inputs = st.one_of(
    _names,
    _names.map(lambda n: n + "."),
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
    st.integers(min_value=0, max_value=2**32 - 1).map(str),
    st.text(alphabet="0123456789xX.abcdef%:[]", max_size=20),
)


@PROPERTY
@given(_host_inputs)
def test_normalise_host_is_idempotent(raw: str) -> None:
    try:
        once = normalise_host(raw)
    except HostError:
        return
    assert normalise_host(once) == once


@st.composite
def _ipv4_spellings(draw: st.DrawFn) -> tuple[IPv4Address, str]:
    """An IPv4 address and one inet_aton spelling of it (1 to 4 parts, any radix per part)."""
    address = draw(st.ip_addresses(v=4))
    assert isinstance(address, IPv4Address)
    value = int(address)
    count = draw(st.integers(min_value=1, max_value=4))
    octets = [(value >> (8 * (3 - i))) & 0xFF for i in range(4)]
    numbers = [*octets[: count - 1], value & ((1 << (8 * (5 - count))) - 1)]
    parts = []
    for number in numbers:
        radix = draw(st.sampled_from(["dec", "hex", "HEX", "oct"]))
        if radix == "dec":
            parts.append(str(number))
        elif radix == "hex":
            parts.append(f"0x{number:x}")
        elif radix == "HEX":
            parts.append(f"0X{number:X}")
        else:
            parts.append(f"0{number:o}")
    text = ".".join(parts)
    if draw(st.booleans()):
        text += "."
    return address, text


@PROPERTY
@given(_ipv4_spellings())
def test_every_ipv4_spelling_normalises_to_the_dotted_quad(case: tuple[IPv4Address, str]) -> None:
    address, text = case
    assert parse_ip_literal(text) == address
    assert normalise_host(text) == str(address)
