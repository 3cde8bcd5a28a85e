"""Source addresses a sandbox may be identified by (transparent mode). No I/O.

The host rules (proxy/net/nft.py) install each address in an anti-spoofing set, so only
addresses a guest can really send from, and that name one host, are accepted: no
unspecified, loopback, link-local, multicast or broadcast address, no IPv4-mapped IPv6
spelling (write the IPv4 address), no address twice, at most MAX_SOURCE_ADDRESSES.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

__all__ = ["MAX_SOURCE_ADDRESSES", "source_address", "source_addresses"]

# Enough for a dual-stack guest with a few aliases; the nft sets stay small and readable.
MAX_SOURCE_ADDRESSES = 16


def source_address(text: str) -> str:
    """The canonical spelling of a sandbox source address; ValueError saying why it cannot be one."""
    try:
        ip = ipaddress.ip_address(text.strip() if isinstance(text, str) else text)
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address") from None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id is not None:
            raise ValueError(f"{text}: a zone index (%...) is not an address")
        if ip.ipv4_mapped is not None:
            raise ValueError(f"{text} is an IPv4-mapped spelling: give {ip.ipv4_mapped} instead")
    kind = _unusable(ip)
    if kind:
        raise ValueError(f"{ip} is {kind}: a sandbox needs a unicast address it can send from")
    return str(ip)


def source_addresses(texts: Iterable[str]) -> tuple[str, ...]:
    """Canonical, distinct sandbox source addresses, at most MAX_SOURCE_ADDRESSES."""
    out: list[str] = []
    for text in texts:
        addr = source_address(text)
        if addr in out:
            raise ValueError(f"address {addr} is listed twice")
        out.append(addr)
    if len(out) > MAX_SOURCE_ADDRESSES:
        raise ValueError(f"{len(out)} addresses: a sandbox has at most {MAX_SOURCE_ADDRESSES}")
    return tuple(out)


def _unusable(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip == ipaddress.IPv4Address("255.255.255.255"):
        return "the broadcast address"
    return ""
