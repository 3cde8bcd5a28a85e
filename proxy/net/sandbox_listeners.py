"""Sandbox listeners opened at run time: a transparent and a DNS listener, for jails.

A gateway started with only an explicit listener (the quick start) fronts no network
sandbox. `POST /v1/listeners/sandbox` on its admin API makes it open a transparent listener
(through mitmproxy's `mode` option, which starts servers while running) and its own DNS
listener, each on a free port of every IPv4 address, kept until the gateway exits and shown
in its status. Jails then register with this one gateway, so their traffic is decided,
audited and reloaded with everything else it serves.

With workers, only the lead (worker 0) serves the public admin API, so only it opens them: the
host rules send every interface to the lead's ports when the config has no transparent and DNS
listener of its own (registration.steered_ports), never to a worker that has none.

Why every address: the host rules redirect a guest to the primary address of the interface
it came in on (one per jail), so no fixed address would do. What a source that is no
registered sandbox gets there is what it gets on any transparent listener: its connection
is closed (`no_identity`), its DNS query REFUSED, each with an audit record; a guest
cannot borrow a sandbox's address (the host rules drop a sandbox source address arriving on
any other interface), and a connection straight to the listener is a connection to the
gateway's own address, which the address guard never dials.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.exceptions import OptionsError
from mitmproxy.master import Master
from mitmproxy.proxy.mode_specs import ProxyMode

from sandgate.proxy.context import GatewayContext
from sandgate.proxy.dns.listener import DnsListener
from sandgate.proxy.errors import ProxyError
from sandgate.proxy.net.listen_backlog import widen_listen_backlog

__all__ = ["ANY_IPV4", "SandboxListeners", "SandboxListenersError"]

log = structlog.get_logger("sandgate.listeners")

ANY_IPV4 = "0.0.0.0"
# A port picked free can be taken before it is bound: try a few.
ATTEMPTS = 5


class SandboxListenersError(ProxyError):
    """A sandbox listener could not be opened."""


@dataclass
class SandboxListeners:
    """The gateway's transparent and DNS listeners, and those it opened on demand."""

    master: Master
    ctx: GatewayContext
    dns: DnsListener | None
    dns_max_ttl: int
    backlog: int
    # Called after a listener opened (the gateway rewrites its status file).
    changed: Callable[[], None]

    def __post_init__(self) -> None:
        self.opened: list[str] = []
        self._lock = asyncio.Lock()

    @property
    def _proxyserver(self) -> Proxyserver:
        server = self.master.addons.get("proxyserver")
        assert isinstance(server, Proxyserver)
        return server

    def transparent_port(self) -> int | None:
        """The port of a running transparent listener, if any."""
        for instance in self._proxyserver.servers:
            if instance.mode.type_name == "transparent" and instance.is_running:
                addrs = instance.listen_addrs
                if addrs:
                    return int(addrs[0][1])
        return None

    async def ensure(self) -> tuple[int, int]:
        """(transparent port, DNS port), opening whichever is missing; raises SandboxListenersError."""
        async with self._lock:
            opened: list[str] = []
            try:
                port = self.transparent_port()
                if port is None:
                    port = await self._open_transparent()
                    opened.append(f"transparent@{ANY_IPV4}:{port}")
                if self.dns is None:
                    self.dns = await self._open_dns()
                    opened.append(self.dns.listener)
            finally:
                # Whatever opened is shown, also when the other one then failed.
                if opened:
                    self.opened += opened
                    log.info("listeners.opened_on_demand", listeners=opened)
                    self.changed()  # once per gateway: rewrites the status file
            return port, self.dns.port

    async def _open_transparent(self) -> int:
        options = self.master.options
        for _ in range(ATTEMPTS):
            port = _free_port(socket.SOCK_STREAM)
            spec = f"transparent@{ANY_IPV4}:{port}"
            before = list(options.mode)
            # Setting the option starts the server in a task; `update` waits for it under the
            # servers' lock and then finds nothing left to do.
            try:
                options.update(mode=[*before, spec])
            except OptionsError as e:
                raise SandboxListenersError(f"could not open a transparent listener: {e}") from None
            servers = self._proxyserver.servers
            await servers.update([ProxyMode.parse(m) for m in options.mode])
            if servers[spec].is_running:
                widen_listen_backlog(self._proxyserver, self.backlog)
                return port
            options.update(mode=before)  # stops the one that failed
            await servers.update([ProxyMode.parse(m) for m in options.mode])
        raise SandboxListenersError("could not open a transparent listener: no free port could be bound")

    async def _open_dns(self) -> DnsListener:
        for _ in range(ATTEMPTS):
            listener = DnsListener(
                self.ctx, self.ctx.bindings, ANY_IPV4, _free_port(socket.SOCK_DGRAM), max_ttl=self.dns_max_ttl
            )
            try:
                await listener.start()
            except OSError:
                await listener.stop()
                continue
            return listener
        raise SandboxListenersError("could not open a DNS listener: no free port could be bound")


def _free_port(kind: socket.SocketKind) -> int:
    """A port free for both TCP and UDP on every IPv4 address, at the moment of asking."""
    other = socket.SOCK_DGRAM if kind == socket.SOCK_STREAM else socket.SOCK_STREAM
    while True:
        with socket.socket(socket.AF_INET, kind) as first:
            first.bind((ANY_IPV4, 0))
            port = int(first.getsockname()[1])
            with socket.socket(socket.AF_INET, other) as second:
                try:
                    second.bind((ANY_IPV4, port))
                except OSError:
                    continue
        return port
