"""The operator's address guard: which resolved or literal addresses may be dialled at all.

The guard is the operator's, never the tenant's. In order:
  1. the gateway's own addresses (every address of every interface, also inside an IPv6
     form that carries them) are never dialled;
  2. public addresses are dialled;
  3. unspecified, multicast, broadcast and metadata addresses are never dialled, whatever
     any list or rule says;
  4. any other class (private, CGNAT, ULA, loopback, link-local, reserved) only inside a
     range the operator opens: `tenant_reachable` when the tenant's own internal-only cidr
     rule also covers the address, or `reachable_by_name` when the address was reached
     through a name a rule names explicitly (never a raw IP, never `hosts: ["*"]`).
A tenant rule alone never opens anything the guard refuses.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from sandgate.policy.addresses import AddressClass, CidrSet, classify, embedded_ipv4
from sandgate.policy.decision import Refusal

__all__ = ["NEVER_OPENED", "AddressGuard", "IPAddress"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Classes no operator range opens: dialling them reaches this host, every host, or the cloud's
# credential service.
NEVER_OPENED = frozenset(
    {AddressClass.UNSPECIFIED, AddressClass.MULTICAST, AddressClass.BROADCAST, AddressClass.METADATA}
)


def _networks(items: Iterable[str] | CidrSet) -> CidrSet:
    return items if isinstance(items, CidrSet) else CidrSet(items)


class AddressGuard:
    """Decides whether an address may be dialled; immutable (a new own-address set is a new guard)."""

    __slots__ = ("_own", "_reachable_by_name", "_tenant_reachable")

    def __init__(
        self,
        reachable_by_name: Iterable[str] | CidrSet = (),
        own_addresses: Iterable[str] = (),
        tenant_reachable: Iterable[str] | CidrSet = (),
    ) -> None:
        self._reachable_by_name = _networks(reachable_by_name)
        self._tenant_reachable = _networks(tenant_reachable)
        self._own = _own_set(own_addresses)

    @property
    def own_addresses(self) -> frozenset[IPAddress]:
        return self._own

    @property
    def tenant_reachable(self) -> CidrSet:
        return self._tenant_reachable

    def with_own_addresses(self, own_addresses: Iterable[str]) -> AddressGuard:
        """The same operator ranges with a new own-address set (interfaces changed)."""
        return AddressGuard(self._reachable_by_name, own_addresses, self._tenant_reachable)

    def refusal(
        self, ip: IPAddress, *, by_name: bool, tenant_opens: bool, public_only: bool = False
    ) -> str | None:
        """Why the gateway may not dial `ip`, or None when it may (see `check`)."""
        found = self.check(ip, by_name=by_name, tenant_opens=tenant_opens, public_only=public_only)
        return found.why if found is not None else None

    def check(
        self, ip: IPAddress, *, by_name: bool, tenant_opens: bool, public_only: bool = False
    ) -> Refusal | None:
        """The refusal of `ip`, or None when the gateway may dial it.

        `by_name`: the address came from resolving a name; `tenant_opens`: an internal-only
        cidr rule of the tenant covers it on this port; `public_only`: the name was allowed
        by `hosts: ["*"]` (or by nothing, in report mode), so no operator range applies to it.
        """
        if self.is_own(ip):
            return Refusal(str(ip), f"{ip} is an address of the gateway itself", "own")
        address_class = classify(ip)
        if address_class is AddressClass.PUBLIC:
            return None
        kind = address_class.value
        if address_class in NEVER_OPENED:
            return Refusal(str(ip), f"{ip} is a {kind} address, never reachable", kind)
        if tenant_opens and ip in self._tenant_reachable:
            return None
        if by_name and not public_only and ip in self._reachable_by_name:
            return None
        why = f"{ip} is a {kind} address the operator does not open to this request"
        return Refusal(str(ip), why, kind)

    def permits(self, ip: IPAddress, *, by_name: bool, tenant_opens: bool, public_only: bool = False) -> bool:
        """Whether the gateway may dial `ip` for this request."""
        return self.refusal(ip, by_name=by_name, tenant_opens=tenant_opens, public_only=public_only) is None

    def is_own(self, ip: IPAddress) -> bool:
        """Whether `ip`, or an IPv4 address it carries (mapped, NAT64, 6to4, ...), is the gateway's."""
        own = self._own
        if ip in own:
            return True
        return isinstance(ip, ipaddress.IPv6Address) and any(v4 in own for v4 in embedded_ipv4(ip))


def _own_set(addresses: Iterable[str]) -> frozenset[IPAddress]:
    """Addresses as a set; IPv4-mapped IPv6 spellings are stored as their IPv4 address."""
    out: set[IPAddress] = set()
    for text in addresses:
        ip = ipaddress.ip_address(text.partition("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        out.add(ip)
    return frozenset(out)
