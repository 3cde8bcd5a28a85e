"""The operator's address guard: which resolved or literal addresses may be dialled at all."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from .addresses import AddressClass, CidrSet, classify

__all__ = ["AddressGuard", "IPAddress"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressGuard:
    """Refuses loopback, private, link-local, metadata, CGNAT, multicast, reserved and the
    gateway's own addresses, unless a tenant `cidr` rule covers the address, or the address
    was reached by name and the operator lists its range in `reachable_by_name`.
    """

    __slots__ = ("_own", "_reachable_by_name")

    def __init__(self, reachable_by_name: Iterable[str] = (), own_addresses: Iterable[str] = ()) -> None:
        self._reachable_by_name = CidrSet(reachable_by_name)
        self._own = CidrSet(f"{a}/{ipaddress.ip_address(a).max_prefixlen}" for a in own_addresses)

    def permits(self, ip: IPAddress, *, by_name: bool, tenant_covers: bool) -> bool:
        """Whether the gateway may dial `ip` for this request."""
        if tenant_covers:
            return True
        if ip in self._own:
            return False
        if classify(ip) is AddressClass.PUBLIC:
            return True
        return by_name and ip in self._reachable_by_name
