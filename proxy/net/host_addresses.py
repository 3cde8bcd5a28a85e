"""The gateway host's own addresses: every address of every interface, kept current (Linux).

Read with one netlink RTM_GETADDR dump (IPv4 secondaries and IPv6 included, which the old
SIOCGIFADDR ioctl missed), and re-read off the request path when the kernel announces an
address change (netlink multicast) and every `interval` seconds anyway (an event can be lost
when the socket buffer overflows). The guard then swaps in an immutable set.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
from collections.abc import Callable, Iterator

import structlog

from sandgate.proxy.tasks import BackgroundTask

__all__ = ["OwnAddressWatcher", "own_addresses"]

log = structlog.get_logger("sandgate.hostaddrs")

_RTM_NEWADDR, _RTM_GETADDR = 20, 22
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_IFA_ADDRESS, _IFA_LOCAL, _IFA_BROADCAST = 1, 2, 4
_RTMGRP_IPV4_IFADDR, _RTMGRP_IPV6_IFADDR = 0x10, 0x100
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTATTR = struct.Struct("=HH")  # length, type
_RECV_BYTES = 1 << 17
_DEBOUNCE_SECONDS = 0.05


def _align(n: int) -> int:
    return (n + 3) & ~3


def _messages(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(type, seq, payload) of each netlink message in one datagram."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, msg_type, _, seq, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size or offset + length > len(data):
            return
        yield msg_type, seq, data[offset + _HEADER.size : offset + length]
        offset += _align(length)


def _addresses(payload: bytes) -> set[str]:
    """The local (and broadcast) addresses of one RTM_NEWADDR message."""
    family = payload[0]
    size = {int(socket.AF_INET): 4, int(socket.AF_INET6): 16}.get(family)
    if size is None:
        return set()
    attrs: dict[int, bytes] = {}
    offset = _IFADDRMSG.size
    while offset + _RTATTR.size <= len(payload):
        length, attr_type = _RTATTR.unpack_from(payload, offset)
        if length < _RTATTR.size:
            break
        attrs.setdefault(attr_type, payload[offset + _RTATTR.size : offset + length])
        offset += _align(length)
    found: set[str] = set()
    # On a point-to-point link IFA_ADDRESS is the peer's; IFA_LOCAL is ours when present.
    local = attrs.get(_IFA_LOCAL, attrs.get(_IFA_ADDRESS))
    for raw in (local, attrs.get(_IFA_BROADCAST)):
        if raw is not None and len(raw) == size:
            found.add(str(ipaddress.ip_address(raw)))
    return found


def own_addresses() -> list[str]:
    """Every IPv4 and IPv6 address assigned to an interface of this host (and IPv4 broadcasts)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        s.settimeout(5)
        s.bind((0, 0))
        seq = 1
        request = _HEADER.pack(
            _HEADER.size + _IFADDRMSG.size, _RTM_GETADDR, _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0
        ) + _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        s.sendto(request, (0, 0))
        found: set[str] = set()
        while True:
            for msg_type, msg_seq, payload in _messages(s.recv(_RECV_BYTES)):
                if msg_seq != seq:
                    continue
                if msg_type == _NLMSG_DONE:
                    return sorted(found)
                if msg_type == _NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", payload)
                    if code:
                        raise OSError(-code, "netlink RTM_GETADDR failed")
                    continue
                if msg_type == _RTM_NEWADDR:
                    found |= _addresses(payload)


class OwnAddressWatcher:
    """Calls `on_change` with the new address set whenever this host's addresses change."""

    def __init__(
        self,
        on_change: Callable[[frozenset[str]], None],
        current: frozenset[str],
        *,
        interval: float,
        read: Callable[[], list[str]] = own_addresses,
    ) -> None:
        self._on_change = on_change
        self._current = current
        self._interval = interval
        self._read = read
        self._wake = asyncio.Event()
        self._sock: socket.socket | None = None
        self._task = BackgroundTask("sandgate-own-addresses", self._run)
        self.refreshes = 0

    async def start(self) -> None:
        """Subscribe to address events (periodic re-reads only if that is refused) and watch."""
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
            sock.bind((0, _RTMGRP_IPV4_IFADDR | _RTMGRP_IPV6_IFADDR))
            sock.setblocking(False)
            asyncio.get_running_loop().add_reader(sock.fileno(), self._on_event)
            self._sock = sock
        except OSError as e:
            log.warning("own_addresses.no_events", error=e.strerror, interval=self._interval)
        self._task.start()

    async def stop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        await self._task.stop()

    def _on_event(self) -> None:
        """Drain the event socket; what changed is read back whole (events can be lost)."""
        assert self._sock is not None
        with contextlib.suppress(OSError):  # BlockingIOError when drained; ENOBUFS on overflow
            while self._sock.recv(_RECV_BYTES):
                pass
        self._wake.set()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)
            await asyncio.sleep(_DEBOUNCE_SECONDS)  # one re-read for a burst of changes
            self._wake.clear()
            await self.refresh()

    async def refresh(self) -> None:
        """Re-read the addresses (in a thread: a dump on a host with many veths takes a while)."""
        try:
            found = frozenset(await asyncio.to_thread(self._read))
        except Exception:
            log.exception("own_addresses.read_failed")  # the last known set stays in force
            return
        self.refreshes += 1
        if found != self._current:
            added, removed = sorted(found - self._current), sorted(self._current - found)
            self._current = found
            self._on_change(found)
            log.info("own_addresses.changed", added=added, removed=removed, count=len(found))
