"""Addons: caps on guest connections, the idle timeout, and file-descriptor headroom.

What each limit counts:
- `max_per_source`: connections from one source address (an IPv6 /64) that have not identified
  themselves: no request head with a valid Proxy-Authorization yet (explicit proxy), or a
  source that maps to no sandbox (transparent). Identified connections count for their sandbox
  instead, so many sandboxes behind one address (a NAT, the host's loopback) share nothing but
  this cap on the connections that are still anonymous.
- `max_per_sandbox`: identified connections of one sandbox. Explicit proxy: from the request
  head whose Proxy-Authorization names it (`SandboxConnectionCap`, right after Identify; the
  passthrough front asks the same through `attribute_front`). Transparent: from connect, the
  source address being the sandbox's.
- fd headroom: the descriptors of this process (RLIMIT_NOFILE is a per-process limit).
- With N workers both caps are the gateway's: each worker enforces its `Shares`, ceil(cap / N)
  (the kernel's SO_REUSEPORT hash spreads one client's connections evenly over the workers,
  so a client meets the cap close to it and never past N x ceil(cap / N)); a transparent
  sandbox is steered to one worker by the host rules, so that worker holds its whole cap.
  Nothing is asked of another process: no connection waits on one.

At connect (`ConnectionLimits`, first in the chain; the front through `admit_front`), a new
connection is decided in this order (`_make_room`):
1. transparent, its sandbox at `max_per_sandbox`: closed at connect (nothing to answer yet);
2. past the hard fd mark: the oldest idle unidentified connection (any source) is closed, then
   the new one admitted; with none idle, the new one is closed;
3. past the soft mark, from a source holding `LIGHT_SOURCE` or more unidentified connections:
   the same, the source's own oldest idle one first;
4. not identified, its source at its share of `max_per_source`: the source's oldest idle
   unidentified connection is closed, and the new one is admitted even when none of them is
   idle (each is then new, has unread bytes or a hook running: about to identify itself or be
   answered; the sweep trims the source back to its share once they are idle, and the fd
   marks bound them all meanwhile).
Evict, then admit: a connection that may be about to send a request is never turned away while
idle, unidentified connections hold descriptors. Idle here: not identified, no request in
flight, no hook running on it, no byte of it unread (asyncio's buffer, the kernel's), and no
byte either way for `RECLAIM_AFTER_SECONDS` (a client that just connected may not have written
its request yet: a burst's connections are written one after another); oldest: accepted
first. A connection refused once identified (explicit proxy) gets 429 `connection_limit`
with `Connection: close`, one record like any denial; closes at connect and evictions are
audited per source, limit and second (`RefusalAudit`), never one record each.

Idle: a connection with no request in flight and no byte either way for `idle_timeout_seconds`
is closed (a brand-new silent one too). A request is in flight from its `request` hook (fully
received) to its response or error; a half-sent head is the head-read timeout's, a stalled
body is idle. Connections whose requests the gateway cannot see (passthrough TLS, raw TCP,
after a 101) are left to mitmproxy's `tcp_timeout` (`tunnel_idle_timeout_seconds`), which also
bounds a silent upstream.

The idle sweep and eviction read mitmproxy's per-connection handler (its activity clock, hook
count, task and streams); the seam is checked at start-up by `check_seams`, so a mitmproxy
upgrade that moves it fails loudly.
"""

from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import dataclass
from typing import Any

import structlog
from mitmproxy import connection, http
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.proxy import mode_servers, mode_specs, server, server_hooks

from sandgate.policy.decision import Decision, Identity, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.exchange import Exchange, exchange_context
from sandgate.proxy.addons.guest_peer import RECLAIM_AFTER_SECONDS, source_key, stream_buffer_of, unread
from sandgate.proxy.audit.records import DecisionContext, decision_record
from sandgate.proxy.audit.refusals import Record
from sandgate.proxy.config import ConnectionsConfig
from sandgate.proxy.connection_table import ConnectionTable, Reclaimable, Shares
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.net.listen_backlog import widen_listen_backlog
from sandgate.proxy.respond import denied_response, limited_response
from sandgate.proxy.startup.fd_budget import FdBudget
from sandgate.proxy.tasks import BackgroundTask

__all__ = ["ConnectionLimits", "SandboxConnectionCap", "check_seams"]

log = structlog.get_logger("sandgate.connlimits")

# Under fd pressure (past the soft mark) a source holding fewer unidentified connections than
# this gets in as it is; one holding more trades an idle one for the new one.
LIGHT_SOURCE = 4
_EVICTED = "oldest idle connection closed"


@dataclass(slots=True)
class _Handled:
    """A connection in mitmproxy's hands, seen through its connection handler."""

    proxyserver: Proxyserver
    client_id: str

    def _io(self) -> server.ConnectionIO | None:
        handler = self.proxyserver.connections.get(self.client_id)
        return handler.transports.get(handler.client) if handler is not None else None

    def idle(self) -> bool:
        handler = self.proxyserver.connections.get(self.client_id)
        if handler is None:
            return False
        watchdog = handler.timeout_watchdog
        # Busy: a hook is running for it, or it was accepted or spoke moments ago.
        if watchdog.blocker or time.time() - watchdog.last_activity < RECLAIM_AFTER_SECONDS:
            return False
        io = handler.transports.get(handler.client)
        # No task yet: mitmproxy is still starting it (its client_connected hooks).
        return io is not None and io.handler is not None and not unread(io.reader, io.writer)

    def close(self) -> None:
        io = self._io()
        if io is not None and io.handler is not None:
            # What mitmproxy's own inactivity timeout does (ConnectionHandler.on_timeout).
            io.handler.cancel("sandgate: connection reclaimed")


class ConnectionLimits:
    """First addon: caps and fd headroom at connect, in-flight tracking, the idle sweep."""

    def __init__(
        self,
        ctx: GatewayContext,
        cfg: ConnectionsConfig,
        proxyserver: Proxyserver,
        *,
        workers: int = 1,
    ) -> None:
        self.ctx = ctx
        self.cfg = cfg
        self.proxyserver = proxyserver
        self.shares = Shares.of(cfg, workers)
        self.table = ConnectionTable()
        self.budget = FdBudget(cfg.fd_headroom_percent)
        self.refusals = ctx.refusals
        self._accepted: set[str] = set()
        self._upstreams: set[str] = set()
        # Connections the front admitted and hands to mitmproxy (by peer): counted once, not twice.
        self._handoffs: set[tuple[Any, ...]] = set()
        # Reclaimed connections whose descriptors are not closed yet (the fd marks discount them).
        self._reclaiming = 0
        self._sweeper = BackgroundTask("sandgate-idle-sweep", self._sweep_loop)
        self.idle_closed = 0
        self.refused = 0
        self.evicted = 0

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
            listener = client.proxy_mode.full_spec
            reclaim = _Handled(self.proxyserver, client.id)
            if self._handed_over(client.peername):
                self.table.add(client.id, source, listener=listener, reclaim=reclaim)
                return  # admitted by the front already; its identity is decided on its request
            transparent = isinstance(client.proxy_mode, mode_specs.TransparentMode)
            identity = self.ctx.policy.identify_address(str(client.peername[0])) if transparent else None
            limit = self._admit(client.id, source, identity, listener, reclaim)
            if limit is not None:
                self._refuse(client, source, identity, limit)
        except Exception:
            log.exception("hook_failed", hook="connlimits.client_connected")
            client.error = "sandgate: internal error"

    def _admit(
        self, key: str, source: str, identity: Identity | None, listener: str, reclaim: Reclaimable
    ) -> str | None:
        """Count a new connection, closing an idle one first where a limit says so; returns
        the limit that refuses it (nothing counted), or None."""
        limit = self._make_room(source, identity)
        if limit is not None:
            return limit
        self.table.add(key, source, listener=listener, reclaim=reclaim)
        if identity is not None:
            self.table.attribute(key, identity.sandbox, self.shares.per_steered_sandbox)
        return None

    def _make_room(self, source: str, identity: Identity | None) -> str | None:
        """Evict, then admit (the order is the module docstring's); the refusing limit, or None."""
        cap = self.cfg.max_per_sandbox
        if identity is not None and cap and self.table.per_sandbox.get(identity.sandbox, 0) >= cap:
            return f"connections.max_per_sandbox ({cap})"
        fds = self.budget.fresh_estimate() - self._reclaiming
        pressure = f"fd headroom ({fds} of {self.budget.limit} descriptors open)"
        if fds >= self.budget.hard:
            return None if self._reclaim(None, pressure) else pressure
        held = 0 if identity is not None else self.table.waiting_from(source)
        if fds >= self.budget.soft and held >= LIGHT_SOURCE:
            if self._reclaim(source, pressure) or self._reclaim(None, pressure):
                return None
            return f"fd headroom ({fds} of {self.budget.limit} descriptors open; this source holds {held})"
        if self.shares.per_source and held >= self.shares.per_source:
            # None idle: admitted all the same (see the module docstring, step 4).
            self._reclaim(source, f"connections.max_per_source ({self.cfg.max_per_source})")
        return None

    def _reclaim(self, source: str | None, limit: str) -> bool:
        """Close the oldest idle unidentified connection (of `source`, or of any source) to make
        room for a new one; whether there was one."""
        client_id = self.table.oldest_idle(source)
        if client_id is None:
            return False
        conn = self.table.take(client_id)
        self._reclaiming += 1
        self.evicted += 1
        self._audit(conn.listener, conn.source, None, f"{limit}, {_EVICTED}", evicted=True)
        assert conn.reclaim is not None  # reclaimable() checked it
        conn.reclaim.close()
        return True

    def _refuse(self, client: connection.Client, source: str, identity: Identity | None, limit: str) -> None:
        client.error = "sandgate: connection_limit"
        self.refused += 1
        self._audit(client.proxy_mode.full_spec, source, identity, limit)

    def _audit(
        self, listener: str, source: str, identity: Identity | None, detail: str, *, evicted: bool = False
    ) -> None:
        """Count one connection closed by a limit in the aggregated records (per source, limit, second)."""
        version = self.ctx.policy.version

        def record(src: str, count: int) -> Record:
            dctx = DecisionContext(phase=Phase.CONNECT, listener=listener, client=src, identity=identity)
            decision = Decision(reason=Reason.CONNECTION_LIMIT, policy_version=version, detail=detail)
            rec = decision_record(dctx, decision)
            rec["connections"] = count
            return rec

        # Refusals and evictions under one limit are separate records (their details differ).
        name = detail.partition(" (")[0]
        self.refusals.refused(source, f"{name} evicted" if evicted else name, record)

    def client_disconnected(self, client: connection.Client) -> None:
        if client.id in self._accepted:
            self._accepted.discard(client.id)
            self.budget.tracked -= 1
        self._forget(client.id)

    def _forget(self, key: str) -> None:
        conn = self.table.remove(key)
        if conn is not None and conn.reclaimed:
            self._reclaiming -= 1

    def _handed_over(self, peer: tuple[Any, ...] | None) -> bool:
        if peer is None or tuple(peer) not in self._handoffs:
            return False
        self._handoffs.discard(tuple(peer))
        return True

    # -- connections the passthrough front holds (sandgate.proxy.front) -----------------------

    def admit_front(
        self, key: str, peer: tuple[Any, ...] | None, listener: str, reclaim: Reclaimable
    ) -> bool:
        """Count a connection the front reads first, under the same caps; False when over one
        (nothing counted: the front hands it to mitmproxy, whose client_connected refuses it)."""
        if self._admit(key, source_key(peer), None, listener, reclaim) is not None:
            return False
        self._accepted.add(key)
        self.budget.tracked += 1
        return True

    def attribute_front(self, key: str, sandbox: str) -> bool:
        """Count the front's connection for its sandbox; False when past its share of `max_per_sandbox`."""
        return self.table.attribute(key, sandbox, self.shares.per_sandbox)

    def upstream_opened(self) -> None:
        self.budget.tracked += 1

    def release_front(self, key: str, *, upstream: bool) -> None:
        """The front is done with the connection (closed, or handed to mitmproxy: see expect_handoff)."""
        if key in self._accepted:
            self._accepted.discard(key)
            self.budget.tracked -= 1
        if upstream:
            self.budget.tracked -= 1
        self._forget(key)

    def expect_handoff(self, peer: tuple[Any, ...] | None) -> None:
        """The front admitted this connection and hands it to mitmproxy now: client_connected
        counts it without deciding again (it would be refused silently otherwise, where a
        refusal after its request head must be a 429)."""
        if peer is not None:
            self._handoffs.add(tuple(peer))

    def forget_handoff(self, peer: tuple[Any, ...] | None) -> None:
        """After the handoff: no later connection from the same peer address is taken for it."""
        if peer is not None:
            self._handoffs.discard(tuple(peer))

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
                self.trim()
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

    def trim(self) -> int:
        """Bring sources past their share of `max_per_source` back to it, oldest idle connection
        first (admitted while none was idle, or handed over by the front); returns how many."""
        share = self.shares.per_source
        if not share:
            return 0
        limit = f"connections.max_per_source ({self.cfg.max_per_source})"
        closed = 0
        for source in [source for source, ids in self.table.waiting.items() if len(ids) > share]:
            while self.table.waiting_from(source) > share and self._reclaim(source, limit):
                closed += 1
        return closed


class SandboxConnectionCap:
    """After Identify: an explicit-proxy connection counts for its sandbox once the sandbox is
    known; past the sandbox's share of `max_per_sandbox`, the request is answered 429
    `connection_limit` and the connection closed (never closed without an answer)."""

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
        share = self.limits.shares.per_sandbox
        try:
            exchange = Exchange.of(flow)
            identity = exchange.identity
            state = self.ctx.connections.get(flow.client_conn.id)
            if identity is None or state is None or state.transparent:
                return  # transparent connections were counted at connect
            if self.limits.table.attribute(flow.client_conn.id, identity.sandbox, share):
                return
            # The request's own host, in a tunnel too, and the identity its credential named.
            dctx = exchange_context(state, flow.client_conn, phase, flow=flow, own_target=True)
            limit = f"connections.max_per_sandbox ({self.limits.cfg.max_per_sandbox})"
            decision = Decision(
                reason=Reason.CONNECTION_LIMIT, policy_version=self.ctx.policy.version, detail=limit
            )
            state.refused(Reason.CONNECTION_LIMIT)
            response = limited_response(
                Reason.CONNECTION_LIMIT, "connections.max_per_sandbox", 1, dctx.host, dctx.decision_id
            )
            response.headers["Connection"] = "close"
            if not await exchange.refuse(self.ctx.audit, flow, response, decision, dctx):
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
    io = server.ConnectionIO()
    missing += [f"ConnectionIO.{name}" for name in ("handler", "reader", "writer") if not hasattr(io, name)]
    proxyserver = Proxyserver()
    if not isinstance(getattr(proxyserver, "connections", None), dict):
        missing.append("Proxyserver.connections")
    if not hasattr(mode_servers.AsyncioServerInstance, "_servers") and "_servers" not in getattr(
        mode_servers.AsyncioServerInstance, "__annotations__", {}
    ):
        missing.append("AsyncioServerInstance._servers")
    if not _has_stream_buffer():
        missing.append("asyncio.StreamReader._buffer")  # eviction looks for unread bytes there
    if missing:
        raise RuntimeError(f"mitmproxy's connection handler changed; sandgate's idle sweep needs: {missing}")


async def _never() -> None:
    return None


def _has_stream_buffer() -> bool:
    loop = asyncio.new_event_loop()  # a reader needs one; the caller's may not be running yet
    try:
        reader = asyncio.StreamReader(loop=loop)
        reader.feed_data(b"x")
        return bytes(stream_buffer_of(reader)) == b"x"
    except RuntimeError:
        return False
    finally:
        loop.close()
