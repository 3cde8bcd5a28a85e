"""Steering in the host rules: each sandbox interface goes to one worker for both its TCP and its
DNS (worker i owns transparent port T+i and DNS port D+i), checked on the rendered ruleset and
on real traffic: two guests in their own namespaces behind veths, the table applied inside a
namespace playing the host, and small listeners there that answer with the port they serve.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
from support.netns import in_namespace, ip

from sandgate.proxy.net.nft import SandboxInterface, apply_ruleset, render_ruleset, worker_ports
from sandgate.proxy.worker_role import worker_for

T, D = 18081, 18053
# Chosen so that the three workers of N = 3 each get one: worker_for gives tap0 -> 1, tap4 -> 0,
# tap6 -> 2 for N = 3, and tap0 -> 1, tap4 -> 0, tap6 -> 0 for N = 2 (the hash is stable).
SANDBOXES = [
    SandboxInterface("tap0", ("10.213.0.2", "fd00:213::2")),
    SandboxInterface("tap4", ("10.213.0.6",)),
    SandboxInterface("tap6", ("10.213.0.10",)),
]


def _check(text: str) -> None:
    check = subprocess.run(["nft", "-c", "-f", "-"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr


def test_one_worker_keeps_the_plain_redirects_and_no_maps() -> None:
    text = render_ruleset(SANDBOXES, [(T, D)], "sg_steer")
    _check(text)
    assert "map " not in text
    assert f"iifname @ifaces meta l4proto {{ tcp, udp }} th dport 53 redirect to :{D}\n" in text
    assert f"iifname @ifaces meta l4proto tcp redirect to :{T}\n" in text
    assert f"iifname @ifaces tcp dport {{ {T}, {D} }} accept\n" in text
    assert f"iifname @ifaces udp dport {D} accept\n" in text
    assert worker_ports(T, D, 1) == [(T, D)]


def test_two_workers_map_each_interface_to_its_workers_ports() -> None:
    text = render_ruleset(SANDBOXES, worker_ports(T, D, 2), "sg_steer")
    _check(text)
    assert (
        '  map tcp_port { type ifname : inet_service; elements = { "tap0" : 18082, "tap4" : 18081, '
        '"tap6" : 18081 }; }\n' in text
    )
    assert (
        '  map dns_port { type ifname : inet_service; elements = { "tap0" : 18054, "tap4" : 18053, '
        '"tap6" : 18053 }; }\n' in text
    )
    assert "th dport 53 redirect to : iifname map @dns_port\n" in text
    assert "meta l4proto tcp redirect to : iifname map @tcp_port\n" in text
    assert "iifname @ifaces tcp dport { 18081, 18082, 18053, 18054 } accept\n" in text
    assert "iifname @ifaces udp dport { 18053, 18054 } accept\n" in text


def test_three_workers_each_get_the_interfaces_the_hash_gives_them() -> None:
    ports = worker_ports(T, D, 3)
    assert ports == [(18081, 18053), (18082, 18054), (18083, 18055)]
    text = render_ruleset(SANDBOXES, ports, "sg_steer")
    _check(text)
    assert [worker_for(s.interface, 3) for s in SANDBOXES] == [1, 0, 2]
    assert (
        '  map tcp_port { type ifname : inet_service; elements = { "tap0" : 18082, "tap4" : 18081, '
        '"tap6" : 18083 }; }\n' in text
    )
    assert (
        '  map dns_port { type ifname : inet_service; elements = { "tap0" : 18054, "tap4" : 18053, '
        '"tap6" : 18055 }; }\n' in text
    )
    assert "iifname @ifaces tcp dport { 18081, 18082, 18083, 18053, 18054, 18055 } accept\n" in text
    assert "iifname @ifaces udp dport { 18053, 18054, 18055 } accept\n" in text


def test_a_shut_interface_without_addresses_is_steered_like_the_rest() -> None:
    """An interface that keeps no source address is still in @ifaces, so it needs a map entry (a
    failed map lookup would skip the redirect; the input chain then drops, but say it plainly)."""
    text = render_ruleset([SandboxInterface("tap6", ())], worker_ports(T, D, 3), "sg_steer")
    _check(text)
    assert '{ type ifname : inet_service; elements = { "tap6" : 18083 }; }' in text


def test_nothing_to_guard_renders_nothing_and_ports_are_required() -> None:
    assert render_ruleset([], worker_ports(T, D, 2)) == ""
    with pytest.raises(ValueError, match="no listener ports"):
        render_ruleset(SANDBOXES, [])


# -- real traffic --------------------------------------------------------------------------------


@dataclass
class Guest:
    ns: str
    host_if: str
    host4: str
    addr4: str
    host6: str | None = None
    addr6: str | None = None


@dataclass
class Lab:
    tag: str
    host: str
    guests: list[Guest] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    stops: list[Callable[[], None]] = field(default_factory=list)

    def guest(self, host_if: str, n: int, *, ipv6: bool) -> Guest:
        """A namespace joined to the host namespace by a veth pair (IPv4 /30, optionally IPv6 /64)."""
        s = int(self.tag[:2], 16)
        g = Guest(f"sgst-{n}-{self.tag}", host_if, f"10.204.{s}.{4 * n + 1}", f"10.204.{s}.{4 * n + 2}")
        ip("netns", "add", g.ns)
        self.namespaces.append(g.ns)
        ip("-n", self.host, "link", "add", host_if, "type", "veth", "peer", "name", f"sgsn{n}-{self.tag}",
           "netns", g.ns)  # fmt: skip
        ns_if = f"sgsn{n}-{self.tag}"
        ip("-n", self.host, "addr", "add", f"{g.host4}/30", "dev", host_if)
        ip("-n", g.ns, "addr", "add", f"{g.addr4}/30", "dev", ns_if)
        if ipv6:
            g.host6, g.addr6 = f"fd5b:{s:x}:{n}::1", f"fd5b:{s:x}:{n}::2"
            ip("-n", self.host, "addr", "add", f"{g.host6}/64", "dev", host_if, "nodad")
            ip("-n", g.ns, "addr", "add", f"{g.addr6}/64", "dev", ns_if, "nodad")
        for ns, link in ((self.host, host_if), (g.ns, ns_if), (g.ns, "lo")):
            ip("-n", ns, "link", "set", link, "up")
        ip("-n", g.ns, "route", "add", "default", "via", g.host4)
        if ipv6:
            ip("-n", g.ns, "-6", "route", "add", "default", "via", str(g.host6))
        self.guests.append(g)
        return g


def _tcp_listener(port: int) -> Callable[[], None]:
    """Answers every connection with the port it was accepted on (both families)."""
    srv = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.sendall(str(port).encode())

    return _serving(serve, stop, srv)


def _udp_listener(port: int) -> Callable[[], None]:
    """Answers every datagram with the port it arrived on (both families)."""
    srv = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    srv.bind(("::", port))
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                _, peer = srv.recvfrom(512)
            except TimeoutError:
                continue
            except OSError:
                return
            srv.sendto(str(port).encode(), peer)

    return _serving(serve, stop, srv)


def _serving(serve: Callable[[], None], stop: threading.Event, srv: socket.socket) -> Callable[[], None]:
    """Run `serve` on a thread; returns what stops it."""
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def close() -> None:
        stop.set()
        srv.close()
        thread.join(2)

    return close


def _listeners(transparent: int, dns: int) -> list[Callable[[], None]]:
    """One worker's stand-ins: TCP on its transparent port, TCP and UDP on its DNS port."""
    return [_tcp_listener(transparent), _tcp_listener(dns), _udp_listener(dns)]


def _tcp_port(ns: str, address: str, port: int) -> int:
    """From inside `ns`: connect anywhere; the port of the host listener that answered."""

    def ask() -> int:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect((address, port))
            return int(s.recv(16))

    return in_namespace(ns, ask)


def _udp_port(ns: str, address: str) -> int:
    """From inside `ns`: a datagram to port 53 anywhere; the port of the host listener that answered."""

    def ask() -> int:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.settimeout(5)
            s.sendto(b"q", (address, 53))
            return int(s.recv(16))

    return in_namespace(ns, ask)


def _other_worker(tag: str, first: str, count: int) -> str:
    """A host-side interface name the hash steers to another worker than `first`'s."""
    for n in range(100):
        name = f"sgsb{n}-{tag}"
        if worker_for(name, count) != worker_for(first, count):
            return name
    raise AssertionError("no interface name found for another worker")


@pytest.fixture
def lab() -> Iterator[Lab]:
    tag = secrets.token_hex(2)
    lab = Lab(tag, f"sgst-host-{tag}")
    try:
        ip("netns", "add", lab.host)
        lab.namespaces.append(lab.host)
        ip("-n", lab.host, "link", "set", "lo", "up")
        yield lab
    finally:
        for stop in lab.stops:
            with contextlib.suppress(Exception):
                stop()
        # Deleting a namespace deletes its veth ends and its nftables tables with it.
        for ns in lab.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        assert not any(Path("/var/run/netns", ns).exists() for ns in lab.namespaces)


@pytest.mark.root
@pytest.mark.parametrize("workers", [1, 2])
def test_each_guest_reaches_only_its_own_workers_ports_over_tcp_and_dns(lab: Lab, workers: int) -> None:
    """Guest A (IPv4 and IPv6 on one interface) and guest B, on interfaces the hash steers to two
    different workers: every TCP connection (to any address and port, either family) and every
    DNS query (UDP and TCP port 53) of A lands on A's worker's port, B's on B's."""
    a_if = f"sgsa-{lab.tag}"
    b_if = _other_worker(lab.tag, a_if, 2)
    a = lab.guest(a_if, 1, ipv6=True)
    b = lab.guest(b_if, 2, ipv6=False)
    ports = worker_ports(T, D, workers)
    for t, d in ports:
        # Sockets bound on a thread inside the host namespace live there.
        lab.stops += in_namespace(lab.host, partial(_listeners, t, d))
    sandboxes = [
        SandboxInterface(a.host_if, (a.addr4, str(a.addr6))),
        SandboxInterface(b.host_if, (b.addr4,)),
    ]
    in_namespace(lab.host, lambda: apply_ruleset(sandboxes, ports, "sg_steer_test"))

    for guest in (a, b):
        t, d = ports[worker_for(guest.host_if, workers)]
        assert _tcp_port(guest.ns, "192.0.2.10", 443) == t, guest.host_if
        assert _tcp_port(guest.ns, "198.51.100.7", 5432) == t
        assert _udp_port(guest.ns, "192.0.2.53") == d
        assert _tcp_port(guest.ns, "192.0.2.53", 53) == d
    # A's IPv6 goes to the same worker as its IPv4: steering is by interface, not by address.
    t, d = ports[worker_for(a.host_if, workers)]
    assert _tcp_port(a.ns, "2001:db8::10", 443) == t
    assert _udp_port(a.ns, "2001:db8::53") == d
    if workers == 2:
        assert {worker_for(a.host_if, 2), worker_for(b.host_if, 2)} == {0, 1}
