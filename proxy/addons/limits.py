"""Addon: tenants' rate, size and byte limits (sandgate.policy.limiter), as they apply to flows.

After the gates in the chain, and only on what the policy allowed (report mode too):
- each HTTP request the request gate allowed counts as a request (429 `rate_limited` with
  Retry-After); a declared body over `request_body_bytes` is 413 `body_too_large`; a body of
  unknown length is metered as it goes and cut at the body or byte limit;
- each new passthrough or raw tunnel counts as one request when its upstream is dialled;
- each chunk a guest sends on a raw TCP stream (a `protocol: tcp` tunnel, a non-WebSocket
  101) or into a passed-through TLS tunnel counts as egress bytes, and the stream is cut at
  the byte limit.
Egress bytes of an HTTP request: its request line, headers and body as the guest sent them.
A refused request's denial is its exchange's one record (sandgate.proxy.addons.exchange).
Every hook is guarded: a fault denies with `internal_error`.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from mitmproxy import http, tcp
from mitmproxy.proxy import server_hooks

from sandgate.policy.decision import Decision, Identity
from sandgate.policy.limiter import Limiter, LimitExceeded
from sandgate.policy.model.tenant import Limits
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.tunnel_rules import (
    admit_tunnel,
    is_tunnel,
    limit_decision,
    tenant_limits,
    tunnel_base,
    tunnel_context,
)
from sandgate.proxy.audit.records import DecisionContext, decision_record
from sandgate.proxy.context import ConnectionState, GatewayContext
from sandgate.proxy.mitm.closer import ConnectionCloser
from sandgate.proxy.respond import decision_response, limited_response

__all__ = [
    "LimitStreamCut",
    "TenantLimits",
    "body_length_unknown",
    "body_meter",
    "declared_length",
    "head_bytes",
]


log = structlog.get_logger("sandgate.limits")


class TenantLimits:
    """Counts each allowed request and each new tunnel against its tenant's limits."""

    def __init__(self, ctx: GatewayContext, closer: ConnectionCloser | None = None) -> None:
        self.ctx = ctx
        self.closer = closer

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        exchange = Exchange.of(flow)
        pending = exchange.pending
        if pending is None or flow.response is not None or flow.error is not None:
            return  # not allowed by the request gate, or already answered: nothing to count
        dctx, decision = pending
        state = self.ctx.connections.get(flow.client_conn.id)
        try:
            await self._learn_fleet_counts(dctx.identity)
            exceeded = self._admit(flow, dctx, decision)
            if exceeded is not None:
                exchange.withdraw_dial(state)
                response = limited_response(
                    exceeded.reason, exceeded.limit, exceeded.retry_after, dctx.host, dctx.decision_id
                )
                await exchange.refuse(self.ctx.audit, flow, response, limit_decision(decision, exceeded))
        except Exception:
            log.exception("hook_failed", hook="limits.requestheaders")
            fault = Decision.internal_error(self.ctx.policy.version, "hook failed")
            try:
                response = decision_response(fault, dctx.host, dctx.decision_id)
                await exchange.refuse(self.ctx.audit, flow, response, fault)
            finally:
                # Last: the refusal is on the flow before anything else here can fail.
                exchange.withdraw_dial(self.ctx.connections.get(flow.client_conn.id))

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        if data.server.error:
            return  # refused before (the dial guard): nothing is dialled, nothing counted
        try:
            state = self.ctx.connections.get(data.client.id)
            if state is not None and is_tunnel(state):
                await self._admit_tunnel(state, data)
        except Exception:
            log.exception("hook_failed", hook="limits.server_connect")
            data.server.error = "sandgate: internal error"

    async def tcp_message(self, flow: tcp.TCPFlow) -> None:
        messages = flow.messages
        if not messages:
            return
        # mitmproxy keeps every chunk of a raw stream on its flow: an endless stream would grow
        # the gateway without bound. Those before this one were relayed already.
        del messages[:-1]
        message = messages[-1]
        if not message.from_client:
            return
        state = self.ctx.connections.get(flow.client_conn.id)
        try:
            if state is not None and state.denied is not None:
                message.content = b""  # cut already: nothing more goes upstream
                return
            identity = state.identity if state is not None else None
            limits = tenant_limits(self.ctx.policy, identity)
            if state is None or identity is None or limits is None:
                return
            exceeded = self.ctx.limiter.add_egress(
                identity.tenant, identity.sandbox, limits, len(message.content)
            )
            if exceeded is None:
                return
            message.content = b""
            await self._cut_tunnel(
                flow,
                state,
                limit_decision(tunnel_base(self.ctx, state), exceeded, within="in a raw TCP stream"),
            )
        except Exception:
            log.exception("hook_failed", hook="limits.tcp_message")
            message.content = b""
            fault = Decision.internal_error(self.ctx.policy.version, "hook failed")
            if state is not None and state.denied is None:
                await self._cut_tunnel(flow, state, fault)
            elif self.closer is not None:
                self.closer.close(flow.client_conn, flow.server_conn)

    async def _cut_tunnel(self, flow: tcp.TCPFlow, state: ConnectionState, denial: Decision) -> None:
        """Close a raw stream on both sides, then record why (once: later chunks are dropped)."""
        state.refused(denial.reason)
        if self.closer is not None:
            self.closer.close(flow.client_conn, flow.server_conn)
        await self.ctx.audit.emit(decision_record(tunnel_context(state), denial))

    async def _learn_fleet_counts(self, identity: Identity | None) -> None:
        """Fleet mode: decisions on a sandbox new to this gateway wait for one sync, so the
        fleet's count decides them too (later ones use the background task's totals)."""
        learn = self.ctx.limit_learn
        if learn is not None and identity is not None:
            await learn(identity.tenant, identity.sandbox, tenant_limits(self.ctx.policy, identity))

    def _admit(self, flow: http.HTTPFlow, dctx: DecisionContext, decision: Decision) -> LimitExceeded | None:
        """Count an allowed request against its tenant's limits; the refusal when over one."""
        identity = dctx.identity
        limits = tenant_limits(self.ctx.policy, identity)
        if identity is None or limits is None:
            return None
        declared = declared_length(flow.request)
        exceeded = self.ctx.limiter.admit(
            identity.tenant,
            identity.sandbox,
            limits,
            body_bytes=declared,
            egress_bytes=Exchange.of(flow).head_bytes + (declared or 0),
        )
        metered = (
            limits.request_body_bytes is not None
            or limits.egress_bytes_per_hour is not None
            or limits.tenant_egress_bytes_per_hour is not None
        )
        if exceeded is None and metered and body_length_unknown(flow.request) and not flow.request.stream:
            # A body of unknown length is counted as it goes and cut at the limit.
            def cut(ex: LimitExceeded) -> None:
                self._cut_stream(flow, dctx, decision, ex)

            flow.request.stream = body_meter(self.ctx.limiter, identity, limits, cut)
        return exceeded

    def _cut_stream(
        self, flow: http.HTTPFlow, dctx: DecisionContext, decision: Decision, exceeded: LimitExceeded
    ) -> None:
        # The meter raises next; the HTTP error seam cuts the upstream and sends this answer.
        response = limited_response(
            exceeded.reason, exceeded.limit, exceeded.retry_after, dctx.host, dctx.decision_id
        )
        denial = limit_decision(decision, exceeded, within="in a streamed body")
        Exchange.of(flow).refuse_now(self.ctx.audit, flow, response, denial)

    async def _admit_tunnel(
        self, state: ConnectionState, data: server_hooks.ServerConnectionHookData
    ) -> None:
        exceeded = await admit_tunnel(self.ctx, state)
        if exceeded is not None:
            data.server.error = f"sandgate: {exceeded.reason.value}"


class LimitStreamCut(Exception):
    """Raised from a request body stream to abort it: a body or byte limit was passed."""


def head_bytes(request: http.Request) -> int:
    """Bytes of the request line and headers as HTTP/1.1 would send them (CRLFs included)."""
    size = len(request.method) + len(request.path) + len(request.http_version) + 4
    for name, value in request.headers.fields:
        size += len(name) + len(value) + 4
    return size + 2


def declared_length(message: http.Message) -> int | None:
    """The Content-Length of a request or response, or None when absent or unparseable."""
    try:
        length = message.headers.get("content-length")
        return int(length) if length is not None else None
    except ValueError:
        return None


def body_length_unknown(request: http.Request) -> bool:
    """Whether a body of unknown length follows (chunked, or HTTP/2 without Content-Length)."""
    if declared_length(request) is not None:
        return False
    if "chunked" in request.headers.get("transfer-encoding", "").lower():
        return True
    return not request.http_version.startswith("HTTP/1")


def body_meter(
    limiter: Limiter,
    identity: Identity,
    limits: Limits,
    on_exceeded: Callable[[LimitExceeded], None],
) -> Callable[[bytes], bytes]:
    """A request body stream that counts egress and stops at the body or byte limit.

    The chunk that would pass a limit is never sent: `on_exceeded` (audit, kill) runs and the
    stream raises, which aborts the message so the upstream never sees a complete request.
    """
    seen = 0

    def meter(chunk: bytes) -> bytes:
        nonlocal seen
        seen += len(chunk)
        exceeded: LimitExceeded | None = None
        if limits.request_body_bytes is not None and seen > limits.request_body_bytes:
            exceeded = LimitExceeded(Reason.BODY_TOO_LARGE, "request_body_bytes")
        else:
            exceeded = limiter.add_egress(identity.tenant, identity.sandbox, limits, len(chunk))
        if exceeded is not None:
            on_exceeded(exceeded)
            raise LimitStreamCut(exceeded.limit)
        return chunk

    return meter
