"""Every address the gateway listens on, and one line that says why one cannot be had.

mitmproxy reports a taken port as a raw `[Errno 98]` line from its own logger, after the
policy is loaded and the admin socket is up. `check_endpoints` binds each address once
before anything starts (and lets go), so a busy port costs the operator one line naming the
listener, its address and what to change. A bind that fails anyway (a port taken between
the check and the bind) ends in the same line (`failure_line`), and mitmproxy's own line
for it is dropped (`quiet_mitmproxy_bind_errors`).
"""

from __future__ import annotations

import errno
import logging
import socket
from dataclasses import dataclass
from typing import Literal

from sandgate.proxy.config import GatewayConfig, split_listen
from sandgate.proxy.errors import ListenerError

__all__ = [
    "Endpoint",
    "check_endpoints",
    "endpoints",
    "failure_line",
    "probe",
    "quiet_mitmproxy_bind_errors",
]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One address the gateway binds, named for an operator."""

    what: str  # "proxy listener", "transparent listener", "DNS listener", "admin listener"
    host: str
    port: int
    protocol: Literal["tcp", "udp"]
    hint: str  # what to change when the port is taken
    spec: str | None = None  # mitmproxy's mode spec, for its listeners

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def endpoints(config: GatewayConfig) -> list[Endpoint]:
    """Every TCP/UDP address the config makes the gateway listen on."""
    out: list[Endpoint] = []
    explicit = [lst for lst in config.listeners if lst.mode == "regular"]
    for lst in config.listeners:
        if lst.mode == "regular":
            what = "proxy listener"
            hint = (
                "pass a free one with --port"
                if len(explicit) == 1
                else "change its port under listeners: in the config"
            )
        else:
            what, hint = "transparent listener", "change its port under listeners: in the config"
        out.append(Endpoint(what, lst.host, lst.port, "tcp", hint, lst.spec))
    if config.dns is not None:
        dns, hint = config.dns, "change dns.port in the config"
        out += [Endpoint("DNS listener", dns.host, dns.port, proto, hint) for proto in ("udp", "tcp")]
    if config.admin.enabled and config.admin.listen is not None:
        host, port = split_listen(config.admin.listen)
        out.append(Endpoint("admin listener", host, port, "tcp", "change admin.listen in the config"))
    return out


def failure_line(endpoint: Endpoint, error: OSError) -> str:
    """One line: which listener, which address, what went wrong, what to do."""
    where = f"{endpoint.what} {endpoint.address}"
    if endpoint.what == "DNS listener":
        where += f" ({endpoint.protocol})"
    if error.errno == errno.EADDRINUSE:
        return f"{where}: port {endpoint.port} is in use: {endpoint.hint}"
    if error.errno == errno.EADDRNOTAVAIL:
        return f"{where}: {endpoint.host} is not an address of this host"
    if error.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)"
    # mitmproxy's wrapped errors carry their own text in strerror: keep only the system's.
    return f"{where}: {errno.errorcode.get(error.errno or 0, 'error')} {error.strerror or error}"


def probe(endpoint: Endpoint) -> OSError | None:
    """Bind the address as the gateway will (SO_REUSEADDR for TCP, as asyncio does), then let go."""
    if endpoint.port == 0:
        return None  # any free port: nothing to check
    kind = socket.SOCK_STREAM if endpoint.protocol == "tcp" else socket.SOCK_DGRAM
    try:
        infos = socket.getaddrinfo(endpoint.host or None, endpoint.port, type=kind, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return OSError(errno.EADDRNOTAVAIL, str(e))
    for family, type_, proto, _, sockaddr in infos:
        with socket.socket(family, type_, proto) as sock:
            if kind == socket.SOCK_STREAM:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(sockaddr)
            except OSError as e:
                return e
    return None


def check_endpoints(config: GatewayConfig) -> None:
    """Raise ListenerError with one line for the first address the gateway could not bind."""
    for endpoint in endpoints(config):
        error = probe(endpoint)
        if error is not None:
            raise ListenerError(failure_line(endpoint, error))


class _DropBindErrors(logging.Filter):
    """mitmproxy's line for a listener that failed to bind: sandgate says it in its own words."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to listen on" not in str(record.msg)


_FILTER = _DropBindErrors()


def quiet_mitmproxy_bind_errors() -> None:
    """Install the filter on mitmproxy's proxy server logger (once per process)."""
    logger = logging.getLogger("mitmproxy.addons.proxyserver")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
