"""Tests for sandgate.proxy.net.host_addresses: every address of every interface, read over netlink."""

from __future__ import annotations

import secrets

from support.netns import in_namespace, ip, netns_lab

from sandgate.proxy.net.host_addresses import own_addresses


def test_every_address_of_every_interface_is_the_gateway_s_own() -> None:
    """Secondary IPv4 addresses and IPv6 ones too (SIOCGIFADDR saw only the first IPv4 address)."""
    prefix = f"198.18.{secrets.randbelow(256)}"
    with netns_lab() as nl:
        ns = nl.add("addrs")
        ip("-n", ns.name, "addr", "add", f"{prefix}.1/24", "brd", "+", "dev", ns.ns_if)
        ip("-n", ns.name, "addr", "add", f"{prefix}.2/24", "dev", ns.ns_if)
        ip("-n", ns.name, "addr", "add", "2001:db8:5::7/64", "dev", ns.ns_if, "nodad")
        found = set(in_namespace(ns.name, own_addresses))
    expected = {ns.addr, f"{prefix}.1", f"{prefix}.2", f"{prefix}.255", "2001:db8:5::7", "127.0.0.1", "::1"}
    assert expected <= found, sorted(expected - found)
    assert ns.host_addr not in found, "the other end of the veth is not this namespace's address"


def test_the_host_s_addresses_are_read_without_error() -> None:
    found = own_addresses()
    assert "127.0.0.1" in found and found == sorted(set(found))
