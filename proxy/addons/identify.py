"""Addon: who is this? The sandbox is known from where a connection came, never from its content.

Regular mode: `Proxy-Authorization: Basic base64(sandbox-id:token)`, compared in constant
time, checked on the CONNECT and on every absolute-form request, and stripped before
anything is forwarded. No other header, Host or path ever selects a tenant.
"""

from __future__ import annotations

import structlog
from mitmproxy import connection, http

from sandgate.policy.decision import Decision, Identity, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.exchange import Exchange, exchange_context
from sandgate.proxy.addons.guest_peer import client_address, parse_proxy_authorization
from sandgate.proxy.context import ConnectionState, GatewayContext
from sandgate.proxy.respond import denied_response, proxy_auth_required

__all__ = ["Identify"]

log = structlog.get_logger("sandgate.identify")


class Identify:
    """Establishes the identity of each client connection and each proxy request."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    def client_connected(self, client: connection.Client) -> None:
        if client.error:
            return  # refused at connect (connection limits): mitmproxy closes it at once
        try:
            self.ctx.connections[client.id] = ConnectionState(
                listener=client.proxy_mode.full_spec,
                client=client_address(client.peername),
                transparent=client.proxy_mode.type_name == "transparent",
            )
        except Exception:
            log.exception("hook_failed", hook="client_connected")
            client.error = "sandgate: internal error"

    def client_disconnected(self, client: connection.Client) -> None:
        self.ctx.connections.pop(client.id, None)

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        state = self.ctx.connections.get(flow.client_conn.id)
        if state is not None and state.transparent:
            # Never let a credential switch a transparent connection's identity.
            flow.request.headers.pop("Proxy-Authorization", None)
            if state.identity is not None:
                Exchange.of(flow).identity = state.identity
            return
        await self._identify(flow)

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.error is not None:
            return
        state = self.ctx.connections.get(flow.client_conn.id)
        if state is not None and state.transparent:
            # Transparent mode: the identity is the source address's, set at connect.
            flow.request.headers.pop("Proxy-Authorization", None)
            if state.identity is not None:
                Exchange.of(flow).identity = state.identity
            return
        if state is not None and state.in_tunnel:
            # Inside an approved tunnel the identity is the CONNECT's; a header here means nothing.
            flow.request.headers.pop("Proxy-Authorization", None)
            if state.identity is not None:
                Exchange.of(flow).identity = state.identity
            return
        await self._identify(flow)

    async def _identify(self, flow: http.HTTPFlow) -> None:
        try:
            state = self.ctx.connections.get(flow.client_conn.id)
            credentials = parse_proxy_authorization(flow.request.headers.get("Proxy-Authorization"))
            flow.request.headers.pop("Proxy-Authorization", None)
            identity: Identity | None = None
            if credentials is not None:
                identity = self.ctx.policy.authenticate(*credentials)
            if identity is None:
                await self._refuse(flow, state)
                return
            Exchange.of(flow).identity = identity
            if state is not None:
                state.identified(identity)
        except Exception:
            log.exception("hook_failed", hook="identify")
            Exchange.of(flow).identity = None
            flow.response = denied_response(Reason.INTERNAL_ERROR, None, "-")

    async def _refuse(self, flow: http.HTTPFlow, state: ConnectionState | None) -> None:
        phase = Phase.CONNECT if flow.request.method == "CONNECT" else Phase.REQUEST
        dctx = exchange_context(state, flow.client_conn, phase, flow=flow, own_target=True)
        decision = Decision(allowed=False, reason=Reason.NO_IDENTITY, policy_version=self.ctx.policy.version)
        response = proxy_auth_required(dctx.decision_id)
        if not await Exchange.of(flow).refuse(self.ctx.audit, flow, response, decision, dctx):
            flow.response = denied_response(Reason.INTERNAL_ERROR, None, dctx.decision_id)
