"""The gateway host's own interface addresses (Linux), read once at start-up."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from pathlib import Path

__all__ = ["own_addresses"]

_SIOCGIFADDR = 0x8915


def own_addresses() -> list[str]:
    """Every IPv4 and IPv6 address assigned to an interface of this host."""
    found: set[str] = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
            found.add(socket.inet_ntoa(packed[20:24]))
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            found.add(str(ipaddress.IPv6Address(bytes.fromhex(raw))))
    except OSError:
        pass
    return sorted(found)
