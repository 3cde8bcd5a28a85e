"""Graceful shutdown: stop accepting, let in-flight requests finish, record everything decided.

`Drainer.drain(seconds)` (on SIGTERM/SIGINT) closes the listeners, closes client connections
with nothing in flight, and lets the requests in flight finish: an HTTP/1 response sent while
draining says `Connection: close` and mitmproxy closes the connection after it; a request that
still starts on an open connection is refused (503, recorded as `internal_error`). Passed-
through and raw tunnels count as in flight until they close. When every connection is gone,
or the drain time passed, or a second signal came, what is left is cut: the requests still in
flight get their record (`error: "cut by shutdown"`) before their connections are closed, so
nothing decided goes unrecorded. One `gateway.shutdown` line says what was drained and cut.

Two addons share one Drainer: `DrainStart` (before the gates: registers each request, refuses
new ones while draining) and `DrainEnd` (after every addon that records: a request is done
only once its record was emitted).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import structlog
from mitmproxy import http, master

from sandgate.policy.decision import Decision, Phase
from sandgate.proxy.addons.exchange import CUT_BY_SHUTDOWN, Exchange, Record, exchange_context
from sandgate.proxy.audit.records import DecisionContext, decision_record
from sandgate.proxy.context import ConnectionState, GatewayContext
from sandgate.proxy.respond import SHUTTING_DOWN, shutdown_response

__all__ = ["DrainEnd", "DrainStart", "Drainer"]

log = structlog.get_logger("sandgate.runtime")

_POLL = 0.02


class HeldConnections(Protocol):
    """Connections held outside mitmproxy (the passthrough front's), for the drain to count and close."""

    def tunnels(self) -> int: ...
    def open(self) -> int: ...
    def close_idle(self) -> int: ...
    def close_all(self) -> int: ...


class Drainer:
    """In-flight requests by client connection, and the drain that waits for them."""

    def __init__(self, ctx: GatewayContext, mitm: master.Master) -> None:
        self.ctx = ctx
        self._master = mitm
        self.draining = False
        self._inflight: dict[str, http.HTTPFlow] = {}
        self._by_client: Counter[str] = Counter()
        self._cut_now = asyncio.Event()
        self.finished = self.refused = 0
        # The passthrough front's tunnels: in flight until they close, like mitmproxy's.
        self.held: HeldConnections | None = None
        # Called as the drain begins: what waits on something that will not come now (requests
        # held for an operator) is answered at once.
        self.on_drain: list[Callable[[], object]] = []

    # -- bookkeeping (the addons) --------------------------------------------------------------

    def started(self, flow: http.HTTPFlow) -> None:
        if flow.id not in self._inflight:
            self._inflight[flow.id] = flow
            self._by_client[flow.client_conn.id] += 1

    def ended(self, flow: http.HTTPFlow) -> None:
        if self._inflight.pop(flow.id, None) is not None:
            client = flow.client_conn.id
            self._by_client[client] -= 1
            if self._by_client[client] <= 0:
                del self._by_client[client]
            if self.draining:
                self.finished += 1

    def cut_now(self) -> None:
        """End the drain at once (a second signal)."""
        self._cut_now.set()

    # -- the drain -----------------------------------------------------------------------------

    async def drain(self, seconds: float) -> None:
        """Stop accepting, wait for in-flight work up to `seconds`, then cut what is left."""
        self.draining = True
        started = time.monotonic()
        in_flight = len(self._inflight)
        for begin in self.on_drain:
            try:
                begin()
            except Exception:
                log.exception("gateway.drain_hook_failed")
        tunnels = sum(1 for h in self._handlers() if self._is_tunnel(h))
        tunnels += self.held.tunnels() if self.held is not None else 0
        await self._stop_listeners()
        idle_closed = 0
        why = "drained"
        while True:
            idle_closed += self._close_idle()
            if not self._handlers() and (self.held is None or not self.held.open()):
                break
            if self._cut_now.is_set():
                why = "second_signal"
                break
            if time.monotonic() - started >= seconds:
                why = "drain_time"
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._cut_now.wait(), _POLL)
        cut_requests = self._record_cut()
        cut_tunnels = sum(1 for h in self._handlers() if self._is_tunnel(h))
        cut_tunnels += self.held.tunnels() if self.held is not None else 0
        cut_connections = self._close_all()
        log.info(
            "gateway.shutdown",
            ended_by=why,
            seconds=round(time.monotonic() - started, 3),
            in_flight_at_signal=in_flight,
            tunnels_at_signal=tunnels,
            drained=self.finished,
            refused=self.refused,
            idle_closed=idle_closed,
            cut_requests=cut_requests,
            cut_tunnels=cut_tunnels,
            cut_connections=cut_connections,
        )

    async def _stop_listeners(self) -> None:
        ps = self._master.addons.get("proxyserver")
        if ps is None:
            return
        try:
            # Open connections stay; only the listening sockets close.
            await ps.servers.update([])
        except Exception:
            log.exception("gateway.listener_stop_failed")

    def _handlers(self) -> list[Any]:
        ps = self._master.addons.get("proxyserver")
        return list(ps.connections.values()) if ps is not None else []

    def _state(self, handler: Any) -> ConnectionState | None:
        return self.ctx.connections.get(handler.client.id)

    def _is_tunnel(self, handler: Any) -> bool:
        """Bytes pass through without HTTP requests to wait for: in flight until they close."""
        state = self._state(handler)
        return state is not None and (
            state.passthrough
            or state.raw
            or (state.tunnel_decision is not None and state.tunnel_decision.raw_tcp)
        )

    def _close_idle(self) -> int:
        """Close the client connections with no request in flight (not tunnels); how many."""
        closed = 0
        for handler in self._handlers():
            if self._by_client.get(handler.client.id) or self._is_tunnel(handler):
                continue
            if _close(handler):
                closed += 1
        return closed + (self.held.close_idle() if self.held is not None else 0)

    def _close_all(self) -> int:
        held = self.held.close_all() if self.held is not None else 0
        return held + sum(1 for handler in self._handlers() if _close(handler))

    def _record_cut(self) -> int:
        """Record the requests still in flight (their connections close next); how many."""
        cut = 0
        for flow in list(self._inflight.values()):
            exchange = Exchange.of(flow)
            pending = exchange.pending
            if pending is not None:
                try:
                    exchange.complete_nowait(self.ctx.audit, partial(_cut_record, flow))
                except Exception:
                    log.exception("gateway.cut_record_failed", decision_id=pending[0].decision_id)
            cut += 1
        self._inflight.clear()
        self._by_client.clear()
        return cut

    # -- refusing new requests -----------------------------------------------------------------

    def refuse(self, flow: http.HTTPFlow) -> None:
        """503 with `Connection: close` for a request that starts while draining (recorded)."""
        state = self.ctx.connections.get(flow.client_conn.id)
        dctx = exchange_context(state, flow.client_conn, Phase.REQUEST, flow=flow)
        decision = Decision.internal_error(self.ctx.policy.version, SHUTTING_DOWN)
        self.refused += 1
        response = shutdown_response(dctx.decision_id)
        Exchange.of(flow).refuse_now(self.ctx.audit, flow, response, decision, dctx, status=503)


def _cut_record(flow: http.HTTPFlow, dctx: DecisionContext, decision: Decision) -> Record:
    """The record of an allowed request the drain cut."""
    return decision_record(
        dctx,
        decision,
        status=flow.response.status_code if flow.response else None,
        bytes_up=len(flow.request.raw_content or b""),
        error=CUT_BY_SHUTDOWN,
    )


def _close(handler: Any) -> bool:
    """Close a client connection the way mitmproxy's idle timeout does (cancel its reader)."""
    try:
        io = handler.transports.get(handler.client)
        if io is None or io.handler is None or io.handler.done():
            return False
        io.handler.cancel("gateway shutdown")
        return True
    except Exception:
        log.exception("gateway.close_failed")
        return False


class DrainStart:
    """Addon, before the gates: registers each request; while draining, refuses new ones."""

    def __init__(self, drainer: Drainer) -> None:
        self.drainer = drainer

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        try:
            self.drainer.started(flow)
            if self.drainer.draining and flow.response is None and flow.error is None:
                self.drainer.refuse(flow)
        except Exception:
            log.exception("hook_failed", hook="drain_requestheaders")


class DrainEnd:
    """Addon, after every addon that records: a request ends once its record was emitted."""

    def __init__(self, drainer: Drainer) -> None:
        self.drainer = drainer

    def response(self, flow: http.HTTPFlow) -> None:
        try:
            if (
                self.drainer.draining
                and flow.response is not None
                and flow.request.http_version.startswith("HTTP/1")
            ):
                # The last response on this connection: mitmproxy closes it once sent.
                flow.response.headers["Connection"] = "close"
        except Exception:
            log.exception("hook_failed", hook="drain_response")
        finally:
            self.drainer.ended(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self.drainer.ended(flow)
