"""Addons: caps on guest connections, the idle timeout, and file-descriptor headroom.

- At connect (`ConnectionLimits`, first in the chain), a new connection is closed at once when
  the process is past its fd headroom (past the soft mark only sources holding a few
  connections still get in; past the hard mark none), when its source address (an IPv6 /64)
  holds `max_per_source` connections, or, on a transparent listener, when its sandbox (the
  source address's) holds `max_per_sandbox`. Refusals are audited per source and second
  (`RefusalAudit`), never one record per connection.
- Explicit proxy (`SandboxConnectionCap`, right after Identify): once a request's
  Proxy-Authorization named the sandbox, a connection that would take the sandbox past
  `max_per_sandbox` gets 429 `connection_limit` and is closed; one record, like any denial.
- Idle: a connection with no request in flight and no byte either way for
  `idle_timeout_seconds` is closed (a brand-new silent one too). A request is in flight from
  its `request` hook (fully received) to its response or error; a half-sent head is the
  head-read timeout's, a stalled body is idle. Connections whose requests the gateway cannot
  see (passthrough TLS, raw TCP, after a 101) are left to mitmproxy's `tcp_timeout`
  (`tunnel_idle_timeout_seconds`), which also bounds a silent upstream.

The idle sweep reads mitmproxy's per-connection handler (its activity clock and task); the
seam is checked at start-up by `check_seams`, so a mitmproxy upgrade that moves it fails loudly.
"""

from __future__ import annotations

import asyncio
import ipaddress
import resource
import time
from dataclasses import dataclass, field
from typing import Any

import structlog
from mitmproxy import connection, http
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.proxy import mode_servers, mode_specs, server, server_hooks

from sandgate.policy.decision import Decision, Identity, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.identify import IDENTITY_KEY
from sandgate.proxy.addons.refusal import refuse
from sandgate.proxy.audit.records import DecisionContext, decision_record
from sandgate.proxy.audit.refusals import Record
from sandgate.proxy.config import ConnectionsConfig
from sandgate.proxy.context import GatewayContext, decision_context
from sandgate.proxy.fd_budget import FdBudget
from sandgate.proxy.net.listen_backlog import widen_listen_backlog
from sandgate.proxy.respond import denied_response, limited_response
from sandgate.proxy.tasks import BackgroundTask

__all__ = [
    "ConnectionLimits",
    "ConnectionTable",
    "SandboxConnectionCap",
    "check_seams",
    "source_key",
]

log = structlog.get_logger("sandgate.connlimits")

# Under fd pressure (past the soft mark) a source holding fewer connections than this still gets
# in: a flood's sources are refused while a tenant with a connection or two keeps working.
LIGHT_SOURCE = 4


def source_key(peer: tuple[Any, ...] | None) -> str:
    """The address a per-source cap counts: the IPv4 address, or the IPv6 /64 (one host's usual share)."""
    if not peer:
        return "-"
    try:
        addr = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return str(peer[0])
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


@dataclass(slots=True)
class _Conn:
    source: str
    sandboxes: list[str] = field(default_factory=list)
    # Flows fully received and not yet answered: the connection is waiting on the gateway or upstream.
    inflight: set[str] = field(default_factory=set)
    upgraded: bool = False
    closing: bool = False


class ConnectionTable:
    """Open guest connections by client id, with counts per source and per sandbox."""

    def __init__(self) -> None:
        self.conns: dict[str, _Conn] = {}
        self.per_source: dict[str, int] = {}
        self.per_sandbox: dict[str, int] = {}

    def add(self, client_id: str, source: str) -> _Conn:
        conn = self.conns[client_id] = _Conn(source)
        self.per_source[source] = self.per_source.get(source, 0) + 1
        return conn

    def attribute(self, client_id: str, sandbox: str, cap: int) -> bool:
        """Count the connection for `sandbox`; False (and nothing counted) when that passes `cap`."""
        conn = self.conns.get(client_id)
        if conn is None or sandbox in conn.sandboxes:
            return True
        held = self.per_sandbox.get(sandbox, 0)
        if cap and held >= cap:
            return False
        conn.sandboxes.append(sandbox)
        self.per_sandbox[sandbox] = held + 1
        return True

    def remove(self, client_id: str) -> None:
        conn = self.conns.pop(client_id, None)
        if conn is None:
            return
        _decrement(self.per_source, conn.source)
        for sandbox in conn.sandboxes:
            _decrement(self.per_sandbox, sandbox)


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


class ConnectionLimits:
    """First addon: caps and fd headroom at connect, in-flight tracking, the idle sweep."""

    def __init__(
        self,
        ctx: GatewayContext,
        cfg: ConnectionsConfig,
        proxyserver: Proxyserver,
    ) -> None:
        self.ctx = ctx
        self.cfg = cfg
        self.proxyserver = proxyserver
        self.table = ConnectionTable()
        self.budget = FdBudget(cfg.fd_headroom_percent)
        self.refusals = ctx.refusals
        self._accepted: set[str] = set()
        self._upstreams: set[str] = set()
        self._sweeper = BackgroundTask("sandgate-idle-sweep", self._sweep_loop)
        self.idle_closed = 0
        self.refused = 0

    # -- life cycle --------------------------------------------------------------------------

    def running(self) -> None:
        # The gateway raised the soft limit before serving: read the one in force now.
        self.budget.set_limit(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self.budget.sample()
        widen_listen_backlog(self.proxyserver, self.cfg.listen_backlog)
        self.refusals.start()
        self._sweeper.start()

    async def done(self) -> None:
        await self._sweeper.stop()
        await self.refusals.stop()

    # -- connect -----------------------------------------------------------------------------

    def client_connected(self, client: connection.Client) -> None:
        if client.transport_protocol != "tcp":
            return
        self._accepted.add(client.id)
        self.budget.tracked += 1
        try:
            source = source_key(client.peername)
            transparent = isinstance(client.proxy_mode, mode_specs.TransparentMode)
            identity = self.ctx.policy.identify_address(str(client.peername[0])) if transparent else None
            limit = self._over_limit(source, identity)
            if limit is not None:
                self._refuse(client, source, identity, limit)
                return
            self.table.add(client.id, source)
            if identity is not None:
                self.table.attribute(client.id, identity.sandbox, self.cfg.max_per_sandbox)
        except Exception:
            log.exception("hook_failed", hook="connlimits.client_connected")
            client.error = "sandgate: internal error"

    def _over_limit(self, source: str, identity: Identity | None) -> str | None:
        """Which limit a new connection from `source` (of `identity`) would pass, or None."""
        fds = self.budget.fresh_estimate()
        if fds >= self.budget.hard:
            return f"fd headroom ({fds} of {self.budget.limit} descriptors open)"
        held = self.table.per_source.get(source, 0)
        if fds >= self.budget.soft and held >= LIGHT_SOURCE:
            return f"fd headroom ({fds} of {self.budget.limit} descriptors open; this source holds {held})"
        cap = self.cfg.max_per_source
        if cap and held >= cap:
            return f"connections.max_per_source ({cap})"
        cap = self.cfg.max_per_sandbox
        if identity is not None and cap and self.table.per_sandbox.get(identity.sandbox, 0) >= cap:
            return f"connections.max_per_sandbox ({cap})"
        return None

    def _refuse(self, client: connection.Client, source: str, identity: Identity | None, limit: str) -> None:
        client.error = "sandgate: connection_limit"
        self.refused += 1
        listener = client.proxy_mode.full_spec
        version = self.ctx.policy.version

        def record(src: str, count: int) -> Record:
            dctx = DecisionContext(phase=Phase.CONNECT, listener=listener, client=src, identity=identity)
            decision = Decision(reason=Reason.CONNECTION_LIMIT, policy_version=version, detail=limit)
            rec = decision_record(dctx, decision)
            rec["connections"] = count
            return rec

        self.refusals.refused(source, limit.partition(" (")[0], record)

    def client_disconnected(self, client: connection.Client) -> None:
        if client.id in self._accepted:
            self._accepted.discard(client.id)
            self.budget.tracked -= 1
        self.table.remove(client.id)

    # -- connections the passthrough front holds (sandgate.proxy.front) -----------------------

    def admit_front(self, key: str, peer: tuple[Any, ...] | None) -> bool:
        """Count a connection the front reads first, under the same caps; False when over one
        (nothing counted: the front hands it to mitmproxy, whose client_connected refuses it)."""
        source = source_key(peer)
        if self._over_limit(source, None) is not None:
            return False
        self._accepted.add(key)
        self.budget.tracked += 1
        self.table.add(key, source)
        return True

    def attribute_front(self, key: str, sandbox: str) -> bool:
        """Count the front's connection for its sandbox; False when past `max_per_sandbox`."""
        return self.table.attribute(key, sandbox, self.cfg.max_per_sandbox)

    def upstream_opened(self) -> None:
        self.budget.tracked += 1

    def release_front(self, key: str, *, upstream: bool) -> None:
        """The front is done with the connection (closed, or handed to mitmproxy, which counts it anew)."""
        if key in self._accepted:
            self._accepted.discard(key)
            self.budget.tracked -= 1
        if upstream:
            self.budget.tracked -= 1
        self.table.remove(key)

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        self._upstreams.add(data.server.id)
        self.budget.tracked += 1

    def server_disconnected(self, data: server_hooks.ServerConnectionHookData) -> None:
        if data.server.id in self._upstreams:
            self._upstreams.discard(data.server.id)
            self.budget.tracked -= 1

    # -- requests in flight ------------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> None:
        conn = self.table.conns.get(flow.client_conn.id)
        if conn is not None:
            conn.inflight.add(flow.id)

    def response(self, flow: http.HTTPFlow) -> None:
        conn = self.table.conns.get(flow.client_conn.id)
        if conn is not None:
            conn.inflight.discard(flow.id)
            if flow.response is not None and flow.response.status_code == 101:
                conn.upgraded = True  # a byte pipe from here: the tunnel timeout applies

    def error(self, flow: http.HTTPFlow) -> None:
        conn = self.table.conns.get(flow.client_conn.id)
        if conn is not None:
            conn.inflight.discard(flow.id)

    # -- the idle sweep ----------------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        tick = min(1.0, self.cfg.idle_timeout_seconds / 4)
        while True:
            await asyncio.sleep(tick)
            try:
                self.sweep(time.time())
                self.budget.sample()
            except Exception:
                log.exception("connlimits.sweep_failed")

    def sweep(self, now: float) -> int:
        """Close the connections idle for `idle_timeout_seconds`; returns how many."""
        idle = self.cfg.idle_timeout_seconds
        closed = 0
        for handler in list(self.proxyserver.connections.values()):
            client = handler.client
            conn = self.table.conns.get(client.id)
            if conn is None or conn.inflight or conn.upgraded or conn.closing:
                continue
            state = self.ctx.connections.get(client.id)
            if state is not None and (state.passthrough or state.raw):
                continue
            watchdog = handler.timeout_watchdog
            # `blocker`: a hook is running for this connection (it is busy, not idle).
            if watchdog.blocker or now - watchdog.last_activity < idle:
                continue
            io = handler.transports.get(client)
            task = io.handler if io is not None else None
            if task is None:
                continue
            # What mitmproxy's own inactivity timeout does (ConnectionHandler.on_timeout).
            conn.closing = True
            task.cancel("sandgate: idle timeout")
            closed += 1
        self.idle_closed += closed
        return closed


class SandboxConnectionCap:
    """After Identify: an explicit-proxy connection counts for its sandbox once the sandbox is known."""

    def __init__(self, ctx: GatewayContext, limits: ConnectionLimits) -> None:
        self.ctx = ctx
        self.limits = limits

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        await self._check(flow, Phase.CONNECT)

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        await self._check(flow, Phase.REQUEST)

    async def _check(self, flow: http.HTTPFlow, phase: Phase) -> None:
        if flow.response is not None or flow.error is not None:
            return
        cap = self.limits.cfg.max_per_sandbox
        try:
            identity = flow.metadata.get(IDENTITY_KEY)
            state = self.ctx.connections.get(flow.client_conn.id)
            if not isinstance(identity, Identity) or state is None or state.transparent:
                return  # transparent connections were counted at connect
            if self.limits.table.attribute(flow.client_conn.id, identity.sandbox, cap):
                return
            dctx = decision_context(state, phase)
            # The request's own host, in a tunnel too, and the identity its credential named.
            dctx.host, dctx.port = flow.request.host, flow.request.port
            dctx.method = flow.request.method
            dctx.path = None if phase is Phase.CONNECT else flow.request.path
            dctx.identity = identity
            limit = f"connections.max_per_sandbox ({cap})"
            decision = Decision(
                reason=Reason.CONNECTION_LIMIT, policy_version=self.ctx.policy.version, detail=limit
            )
            state.refused(Reason.CONNECTION_LIMIT)
            response = limited_response(
                Reason.CONNECTION_LIMIT, "connections.max_per_sandbox", 1, dctx.host, dctx.decision_id
            )
            response.headers["Connection"] = "close"
            if not await refuse(self.ctx.audit, flow, response, dctx, decision):
                flow.response = denied_response(Reason.INTERNAL_ERROR, None, dctx.decision_id)
                flow.response.headers["Connection"] = "close"
        except Exception:
            log.exception("hook_failed", hook="connlimits.sandbox_cap")
            flow.response = denied_response(Reason.INTERNAL_ERROR, None, "-")
            flow.response.headers["Connection"] = "close"


def check_seams() -> None:
    """Fail start-up loudly when mitmproxy no longer has what the idle sweep reads."""
    handler_cls = server.ConnectionHandler
    missing = [
        name for name in ("on_timeout", "handle_client") if not callable(getattr(handler_cls, name, None))
    ]
    watchdog = server.TimeoutWatchdog(1, _never)
    for name in ("last_activity", "blocker", "register_activity", "disarm"):
        if not hasattr(watchdog, name):
            missing.append(f"TimeoutWatchdog.{name}")
    if not hasattr(server.ConnectionIO(), "handler"):
        missing.append("ConnectionIO.handler")
    proxyserver = Proxyserver()
    if not isinstance(getattr(proxyserver, "connections", None), dict):
        missing.append("Proxyserver.connections")
    if not hasattr(mode_servers.AsyncioServerInstance, "_servers") and "_servers" not in getattr(
        mode_servers.AsyncioServerInstance, "__annotations__", {}
    ):
        missing.append("AsyncioServerInstance._servers")
    if missing:
        raise RuntimeError(f"mitmproxy's connection handler changed; sandgate's idle sweep needs: {missing}")


async def _never() -> None:
    return None
