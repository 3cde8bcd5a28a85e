"""Addon: decide every HTTP request, bound to the destination its connection was allowed.

- Host must name the connection's allowed host (`host_mismatch`), then method and path (the
  normalised path the upstream gets, no fragment); absolute-form proxy requests are decided
  (and resolved) one by one, and may dial only the address checked for them. A request in a
  tunnel is decided with the tunnel's pinned address: what it adds (method, path, headers).
- An allowed request is pending on its exchange (sandgate.proxy.addons.exchange), a place in
  the audit queue reserved: TenantLimits counts it next, and AuditCompletion writes its record
  when the exchange ends.
- A request an `ask` rule matched is held for an operator (sandgate.proxy.approvals.holds);
  in a tunnel an operator approved, it is not asked about again.
- Requests to the gateway's own name (sandgate.proxy.approvals.reserved) are never decided as
  a destination: the guests' endpoint answers them (sandgate.proxy.approvals.endpoint).
Every hook is guarded: an exception denies with `internal_error`, never lets traffic through.
"""

from __future__ import annotations

from dataclasses import replace

import structlog
from mitmproxy import http

from sandgate.policy.decision import Decision, EgressRequest, Phase
from sandgate.policy.errors import HostError
from sandgate.policy.hosts import normalise_host, split_authority
from sandgate.policy.overrides import Decide, decide_readings
from sandgate.policy.paths import Target as TargetReading
from sandgate.policy.paths import read_target
from sandgate.policy.reasons import Reason
from sandgate.policy.upgrade import requested_upgrade
from sandgate.proxy.addons.exchange import Exchange, exchange_context
from sandgate.proxy.addons.guest_peer import peer_ip
from sandgate.proxy.addons.hop_by_hop import strip_hop_by_hop
from sandgate.proxy.addons.limits import declared_length, head_bytes
from sandgate.proxy.addons.refusal import refuse_flow
from sandgate.proxy.approvals.endpoint import AccessEndpoint
from sandgate.proxy.approvals.holds import Holds, asks_released, released
from sandgate.proxy.audit.records import DecisionContext
from sandgate.proxy.context import ConnectionState, GatewayContext

__all__ = ["RequestGate"]

log = structlog.get_logger("sandgate.gate")

DEFAULT_PORTS = {"http": 80, "https": 443}

# (host, port, the pinned address) a request goes to.
Target = tuple[str, int, str | None]


class RequestGate:
    """Decides each HTTP request; answers the reserved name's endpoint."""

    def __init__(self, ctx: GatewayContext, holds: Holds, *, endpoint: AccessEndpoint | None = None) -> None:
        self.ctx = ctx
        self.holds = holds
        # Answers requests to the reserved name; None: no endpoint (and no name is reserved).
        self.endpoint = endpoint

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.error is not None:
            return
        exchange = Exchange.of(flow)
        state = self.ctx.connections.get(flow.client_conn.id)
        dctx = exchange_context(state, flow.client_conn, Phase.REQUEST, flow=flow, request_line=False)
        try:
            if state is None:
                raise RuntimeError("no state for client connection")
            strip_hop_by_hop(flow.request)
            # What the rules match is what the upstream gets: the normalised path, no fragment.
            reading = read_target(flow.request.path)
            flow.request.path = reading.forward
            dctx = replace(dctx, method=flow.request.method, path=flow.request.path)
            exchange.head_bytes = head_bytes(flow.request)
            target = self._request_target(flow, state)
            if isinstance(target, Decision):
                await self._deny(flow, dctx, target)
                return
            host, port, address = target
            dctx = replace(dctx, host=host, port=port, sni=state.sni)
            if self.endpoint is not None and host == self.endpoint.name and not state.in_tunnel:
                # The gateway's own: never forwarded.
                if await self.endpoint.headers(flow, dctx, port):
                    exchange.proposal = dctx
                return
            request = _egress_request(flow, reading, host, port, state.sni)
            decision, dctx = await self._decide(flow, dctx, state, request, address)
            if not decision.allowed or decision.address is None:
                if reading.problem and not decision.detail:
                    decision = replace(decision, detail=reading.problem)
                await self._deny(flow, dctx, decision)
                return
            # Nothing goes upstream without a place for its record (completed when it ends).
            # The record as known now is journaled too: a process killed before the record is
            # written leaves it for whoever settles its journal (sandgate.proxy.audit.intents).
            if not await exchange.allowed(self.ctx.audit, dctx, decision):
                await self._deny(
                    flow, dctx, Decision.internal_error(self.ctx.policy.version, "audit queue full")
                )
                return
            if not state.in_tunnel:
                exchange.permit_dial(state, decision.address, port, host)
                flow.request.data.host = decision.address
        except Exception:
            log.exception("hook_failed", hook="requestheaders")
            await self._deny(flow, dctx, Decision.internal_error(self.ctx.policy.version, "hook failed"))

    async def request(self, flow: http.HTTPFlow) -> None:
        exchange = Exchange.of(flow)
        proposal = exchange.proposal
        if self.endpoint is None or proposal is None or flow.response is not None:
            return
        exchange.proposal = None
        try:
            await self.endpoint.answer(flow, proposal)
        except Exception:
            log.exception("hook_failed", hook="request")
            state = self.ctx.connections.get(flow.client_conn.id)
            dctx = exchange_context(state, flow.client_conn, Phase.REQUEST, flow=flow, request_line=False)
            await self._deny(flow, dctx, Decision.internal_error(self.ctx.policy.version, "hook failed"))

    async def _decide(
        self,
        flow: http.HTTPFlow,
        dctx: DecisionContext,
        state: ConnectionState,
        request: EgressRequest,
        address: str | None,
    ) -> tuple[Decision, DecisionContext]:
        """The request's decision (held for an operator when asked about), and its context."""
        decision = await self.ctx.decide(dctx.identity, request, address=address)
        decide: Decide = self.ctx.decide
        if decision.ask:
            approval = None
            if state.in_tunnel:
                approval = self.holds.tunnel_approval(flow.client_conn, request.host, request.port)
            if approval is not None:
                # The operator approved this tunnel: its requests are not asked about again.
                decision = released(decision, approval)
                decide = asks_released(self.ctx.decide, approval)
            else:
                decision, dctx = await self.holds.hold(flow.client_conn, dctx, decision, state)
        if decision.allowed:
            # Allowed is this request as shown: another method it can mean (an override header)
            # is decided too, and one that would be asked about is refused.
            decision = await decide_readings(decide, dctx.identity, request, decision, address=address)
        return decision, dctx

    def _request_target(self, flow: http.HTTPFlow, state: ConnectionState) -> Target | Decision:
        """(host, port, pinned address) the request goes to, or the denial when Host lies."""
        default_port = DEFAULT_PORTS.get(flow.request.scheme, 80)
        host_header = flow.request.host_header
        if state.in_tunnel:
            assert state.tunnel_host is not None and state.tunnel_port is not None
            host, port = state.tunnel_host, state.tunnel_port
            address = state.tunnel_decision.address if state.tunnel_decision else None
        else:
            try:
                host, port = normalise_host(flow.request.host), flow.request.port
            except HostError as e:
                return self._fault(Reason.INVALID_REQUEST, str(e))
            address = None
        if host_header is None:
            return self._fault(Reason.HOST_MISMATCH, "no Host header")
        try:
            claimed_host, claimed_port = split_authority(host_header, default_port)
        except HostError as e:
            return self._fault(Reason.HOST_MISMATCH, str(e))
        port_ok = claimed_port == port or (":" not in host_header.rsplit("]", 1)[-1])
        if claimed_host != host or not port_ok:
            return self._fault(Reason.HOST_MISMATCH, "Host does not name the approved destination")
        authority = flow.request.authority
        if authority and flow.request.http_version.startswith("HTTP/1"):
            # An absolute-form target is forwarded as is, and servers obey it over Host
            # (RFC 9112 3.2.2): it must name the approved destination too, then go.
            try:
                target_host, target_port = split_authority(authority, default_port)
            except HostError as e:
                return self._fault(Reason.HOST_MISMATCH, str(e))
            if target_host != host or target_port != port:
                return self._fault(
                    Reason.HOST_MISMATCH, "the request target does not name the approved destination"
                )
            flow.request.authority = ""
        return host, port, address

    def _fault(self, reason: Reason, detail: str) -> Decision:
        return Decision(allowed=False, reason=reason, policy_version=self.ctx.policy.version, detail=detail)

    async def _deny(self, flow: http.HTTPFlow, dctx: DecisionContext, decision: Decision) -> None:
        reserved = self.endpoint.reserved if self.endpoint is not None else None
        await refuse_flow(self.ctx, flow, dctx, decision, reserved)


def _egress_request(
    flow: http.HTTPFlow, reading: TargetReading, host: str, port: int, sni: str | None
) -> EgressRequest:
    """What the policy decides of an HTTP request to host:port (its method, path, headers)."""
    headers = tuple(flow.request.headers.items(multi=True))
    return EgressRequest(
        Phase.REQUEST,
        host,
        port,
        scheme=flow.request.scheme,
        method=flow.request.method,
        path=reading.path,
        sni=sni,
        query=reading.query,
        headers=headers,
        body_size=declared_length(flow.request),
        client=peer_ip(flow.client_conn.peername),
        upgrade=requested_upgrade(headers),
    )
