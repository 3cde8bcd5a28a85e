"""Canonical forms of hosts and authorities, for matching (request paths: `paths`). No I/O.

A guest controls every byte of a URL, so each function here either returns the one
form that every resolver, libc and browser would agree on, or raises `HostError`.
The rules follow the WHATWG URL standard's host parser (percent-decode, UTS #46,
"ends in a number" → IPv4), and refuse what they leave open.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from ipaddress import IPv4Address, IPv6Address

import idna

from sandgate.policy.errors import HostError
from sandgate.policy.paths import normalise_path  # re-exported: paths lived here first
from sandgate.policy.percent import read_escapes

__all__ = [
    "normalise_host",
    "normalise_path",
    "not_normal",
    "parse_host_pattern",
    "parse_ip_literal",
    "split_authority",
]

_MAX_INPUT = 1024  # Longer than any valid host; refused before any real work.
_MAX_HOST = 253
_MAX_LABEL = 63
_MAX_ECHO = 80

_LABEL_RE = re.compile(r"[a-z0-9_-]+", re.ASCII)
_DECIMAL_RE = re.compile(r"[1-9][0-9]*|0", re.ASCII)
_OCTAL_RE = re.compile(r"0[0-7]+", re.ASCII)
_HEX_RE = re.compile(r"0[xX][0-9a-fA-F]*", re.ASCII)
_PORT_RE = re.compile(r"[0-9]{1,5}", re.ASCII)

# Named so an error says what was wrong; anything else outside a label is caught later.
_FORBIDDEN_HOST_CHARS = {
    "\x00": "NUL",
    "/": "'/'",
    "\\": "backslash",
    "@": "'@'",
    ":": "':' outside an IPv6 address",
    "%": "'%'",
    "*": "'*'",
    "?": "'?'",
    "#": "'#'",
    "[": "'['",
    "]": "']'",
}


def _echo(text: str) -> str:
    """Repr of at most the first _MAX_ECHO characters of a guest-supplied value."""
    if len(text) > _MAX_ECHO:
        return repr(text[:_MAX_ECHO]) + "..."
    return repr(text)


def _fail(problem: str, host: str) -> HostError:
    """A HostError naming the problem and the host (and nothing more)."""
    return HostError(f"{problem}: {_echo(host)}")


def _is_control_or_space(ch: str) -> bool:
    """Whether a character is whitespace or a C0/C1 control."""
    code = ord(ch)
    return ch.isspace() or code < 0x20 or 0x7F <= code < 0xA0


_PLAIN_HOST = re.compile(r"[A-Za-z0-9._-]*", re.ASCII)


def _check_chars(text: str, host: str) -> None:
    """Refuse whitespace, controls and the named forbidden characters."""
    if _PLAIN_HOST.fullmatch(text):
        return  # the common case, decided by one C-level match instead of a loop per character
    for ch in text:
        if ch == "\x00":
            raise _fail("host contains NUL", host)
        if _is_control_or_space(ch):
            raise _fail("host contains whitespace or a control character", host)
        problem = _FORBIDDEN_HOST_CHARS.get(ch)
        if problem is not None:
            raise _fail(f"host contains {problem}", host)


def _percent_decode(raw: str) -> str:
    """WHATWG host percent-decoding: %XX to bytes, then strict UTF-8."""
    if "%" not in raw:
        return raw
    try:
        data = raw.encode("utf-8")
    except UnicodeEncodeError:
        raise _fail("host is not valid Unicode", raw) from None
    values = read_escapes(data, _fail("host has an invalid percent-escape", raw))
    try:
        return bytes(value for value, _ in values).decode("utf-8")
    except UnicodeDecodeError:
        raise _fail("host percent-decodes to invalid UTF-8", raw) from None


def _uts46_map(decoded: str, host: str) -> str:
    """UTS #46 mapping (lowercase, width folding, ideographic dots), refusing ignored code points."""
    if decoded.isascii():
        return decoded.lower()
    for ch in decoded:
        # UTS #46 silently deletes "ignored" code points (soft hyphen, ZWSP, variation
        # selectors); a guest could hide anything in them, so they are refused instead.
        if not ch.isascii() and _remap(ch, host) == "":
            raise _fail(f"host contains the ignorable code point U+{ord(ch):04X}", host)
    return _remap(decoded, host)


def _remap(text: str, host: str) -> str:
    """idna.uts46_remap without STD3 rules (underscore stays), errors as HostError."""
    try:
        return idna.uts46_remap(text, std3_rules=False)
    except idna.IDNAError:
        raise _fail("host contains a code point IDNA does not allow", host) from None


def _parse_ipv4_number(part: str) -> int | None:
    """One WHATWG/inet_aton IPv4 part (decimal, 0x-hex, 0-octal), or None if it is not one."""
    if _DECIMAL_RE.fullmatch(part):
        if len(part) > 10:  # Above 2**32 anyway; keeps int() away from huge inputs.
            return 1 << 32
        return int(part, 10)
    if _HEX_RE.fullmatch(part):
        digits = part[2:].lstrip("0")
        if len(digits) > 8:
            return 1 << 32
        return int(digits or "0", 16)
    if _OCTAL_RE.fullmatch(part):
        digits = part[1:].lstrip("0")
        if len(digits) > 11:
            return 1 << 32
        return int(digits or "0", 8)
    return None


def _ends_in_a_number(parts: list[str]) -> bool:
    """WHATWG "ends in a number": the last label is ASCII digits or a valid IPv4 number."""
    last = parts[-1]
    if last and last.isascii() and last.isdigit():
        return True
    return _parse_ipv4_number(last) is not None


def _parse_ipv4(text: str, host: str) -> IPv4Address | None:
    """An IPv4 address in any inet_aton form, None for a hostname, HostError if it is neither."""
    parts = text.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()  # One trailing dot, as in "127.0.0.1.".
    if not _ends_in_a_number(parts):
        return None
    if len(parts) > 4:
        raise _fail("host ends in a number but has more than four parts", host)
    numbers: list[int] = []
    for part in parts:
        number = _parse_ipv4_number(part)
        if number is None:
            raise _fail("host ends in a number but is not a valid IPv4 address", host)
        numbers.append(number)
    last = numbers.pop()
    if any(n > 255 for n in numbers) or last >= 256 ** (4 - len(numbers)):
        raise _fail("IPv4 address part out of range", host)
    value = last
    for index, number in enumerate(numbers):
        value += number << (8 * (3 - index))
    return IPv4Address(value)


def _parse_ipv6(text: str, host: str) -> IPv6Address:
    """An IPv6 address (no brackets), refusing zone ids."""
    if "%" in text:
        raise _fail("IPv6 zone ids are not allowed", host)
    if not text.isascii():
        raise _fail("not a valid IPv6 address", host)
    try:
        return IPv6Address(text)
    except ipaddress.AddressValueError:
        raise _fail("not a valid IPv6 address", host) from None


def _format_ip(ip: IPv4Address | IPv6Address) -> str:
    """Canonical text of an address; IPv4-mapped IPv6 as ::ffff:a.b.c.d on every Python."""
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        return f"::ffff:{ip.ipv4_mapped}"
    return ip.compressed


def _prepare(raw: str) -> str:
    """Percent-decode and UTS #46-map a non-bracketed host, refusing junk characters."""
    if not raw:
        raise HostError("host is empty")
    if len(raw) > _MAX_INPUT:
        raise _fail("host is too long", raw)
    _check_chars(raw.replace("%", ""), raw)
    decoded = _percent_decode(raw)
    _check_chars(decoded, raw)
    mapped = _uts46_map(decoded, raw)
    # Mapping can produce ASCII punctuation (U+FF0F FULLWIDTH SOLIDUS becomes '/').
    _check_chars(mapped, raw)
    return mapped


def parse_ip_literal(host: str) -> IPv4Address | IPv6Address | None:
    """The address a resolver, libc or browser would read in `host`, or None for a hostname."""
    if host.startswith("["):
        if not host.endswith("]"):
            raise _fail("unterminated '[' in host", host)
        return _parse_ipv6(host[1:-1], host)
    if ":" in host:
        try:
            return _parse_ipv6(host, host)
        except HostError:
            if "%" in host and _looks_like_ipv6(host.partition("%")[0]):
                raise  # A zone id on an otherwise valid address.
            return None
    return _parse_ipv4(_prepare(host), host)


def _looks_like_ipv6(text: str) -> bool:
    """Whether text parses as an IPv6 address."""
    try:
        IPv6Address(text)
    except ipaddress.AddressValueError:
        return False
    return True


def _check_label(label: str, host: str) -> str:
    """Validate one label and return its A-label form."""
    if not label:
        raise _fail("host has an empty label", host)
    if not label.isascii():
        try:
            label = idna.encode(label, strict=True, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError):
            raise _fail("host has a label that is not valid IDNA", host) from None
    elif label.startswith("xn--"):
        try:
            ulabel = idna.decode(label, strict=True)
            canonical = idna.encode(ulabel, strict=True, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError):
            raise _fail("host has an invalid xn-- label", host) from None
        if canonical != label:
            raise _fail("host has a non-canonical xn-- label", host)
    if not _LABEL_RE.fullmatch(label):
        raise _fail("host has a character not allowed in a label", host)
    if len(label) > _MAX_LABEL:
        raise _fail("host has a label longer than 63 characters", host)
    if label.startswith("-") or label.endswith("-"):
        raise _fail("host has a label that starts or ends with '-'", host)
    return label


# Hosts repeat on the hot path (every request names one, twice); a bounded cache makes the
# common case a dict lookup. Errors are not cached, so hostile junk costs full price each time.
@functools.lru_cache(maxsize=16_384)
def normalise_host(raw: str) -> str:
    """The canonical host for matching: an A-label name, a dotted quad or compressed IPv6."""
    if raw == "*":
        raise HostError("'*' is not a host")
    if raw and (_is_control_or_space(raw[0]) or _is_control_or_space(raw[-1])):
        raise _fail("host has surrounding whitespace", raw)
    ip = parse_ip_literal(raw)
    if ip is not None:
        return _format_ip(ip)
    if ":" in raw:
        raise _fail("host contains ':' outside an IPv6 address", raw)
    mapped = _prepare(raw)
    if mapped.endswith("."):
        mapped = mapped[:-1]
    labels = [_check_label(label, raw) for label in mapped.split(".")]
    result = ".".join(labels)
    if len(result) > _MAX_HOST:
        raise _fail("host is longer than 253 characters", raw)
    return result


def parse_host_pattern(value: str, everything: str) -> tuple[bool, str, str]:
    """(wildcard?, the host as written, its normal form) of `host` or `*.suffix`.

    Raises ValueError for a bare `*` (`everything` says what it would match), a wildcard
    anywhere but a leading `*.`, or a host that cannot be normalised. Whether the written
    form must already be the normal one is the caller's rule (see `not_normal`).
    """
    if value in ("*", "*.", ""):
        raise ValueError(f"{value!r} would {everything}")
    wildcard = value.startswith("*.")
    bare = value[2:] if wildcard else value
    if "*" in bare:
        raise ValueError(f"{value!r}: a wildcard is only allowed as a leading '*.'")
    try:
        return wildcard, bare, normalise_host(bare)
    except HostError as e:
        raise ValueError(f"{value!r}: {e}") from None


def not_normal(value: str, wildcard: bool, bare: str, normal: str) -> ValueError | None:
    """The error for a pattern not written in normal form ("use X instead"), or None."""
    if normal == bare:
        return None
    return ValueError(f"{value!r} is not in normal form: use {('*.' if wildcard else '') + normal!r} instead")


@functools.lru_cache(maxsize=16_384)
def split_authority(authority: str, default_port: int) -> tuple[str, int]:
    """Split `host`, `host:port`, `[v6]` or `[v6]:port` into (normalised host, port)."""
    if not 1 <= default_port <= 65535:
        raise ValueError(f"default_port out of range: {default_port}")
    if not authority:
        raise HostError("authority is empty")
    if "@" in authority or "%40" in authority.lower():
        # Never echo it: userinfo is where credentials live.
        raise HostError("authority contains userinfo ('@'); it is not allowed")
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise _fail("unterminated '[' in authority", authority)
        host, rest = authority[: end + 1], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            raise _fail("junk after ']' in authority", authority)
    else:
        if authority.count(":") > 1:
            raise _fail("IPv6 address in an authority must be in brackets", authority)
        host, colon, port_text = authority.partition(":")
        rest = colon + port_text
    port = default_port
    if rest:
        port_text = rest[1:]
        if not _PORT_RE.fullmatch(port_text):
            raise _fail("port must be 1 to 5 digits", authority)
        port = int(port_text)
        if not 1 <= port <= 65535:
            raise _fail("port out of range 1..65535", authority)
    return normalise_host(host), port
