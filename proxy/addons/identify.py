"""Addon: who is this? The sandbox is known from where a connection came, never from its content.

Regular mode: `Proxy-Authorization: Basic base64(sandbox-id:token)`, compared in constant
time, checked on the CONNECT and on every absolute-form request, and stripped before
anything is forwarded. No other header, Host or path ever selects a tenant.
"""

from __future__ import annotations

import base64
import binascii

import structlog
from mitmproxy import connection, http

from sandgate.policy.decision import Decision, Identity, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.refusal import refuse
from sandgate.proxy.audit.records import DecisionContext
from sandgate.proxy.context import ConnectionState, GatewayContext
from sandgate.proxy.respond import denied_response, proxy_auth_required

__all__ = ["Identify", "client_address", "parse_proxy_authorization"]

log = structlog.get_logger("sandgate.identify")

IDENTITY_KEY = "sandgate.identity"


def parse_proxy_authorization(value: str | None) -> tuple[str, str] | None:
    """(sandbox id, token) from a Basic Proxy-Authorization value, or None."""
    if not value:
        return None
    scheme, _, encoded = value.strip().partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, token = decoded.partition(":")
    return (user, token) if sep and user and token else None


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
                flow.metadata[IDENTITY_KEY] = state.identity
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
                flow.metadata[IDENTITY_KEY] = state.identity
            return
        if state is not None and state.in_tunnel:
            # Inside an approved tunnel the identity is the CONNECT's; a header here means nothing.
            flow.request.headers.pop("Proxy-Authorization", None)
            if state.identity is not None:
                flow.metadata[IDENTITY_KEY] = state.identity
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
            flow.metadata[IDENTITY_KEY] = identity
            if state is not None:
                state.identified(identity)
        except Exception:
            log.exception("hook_failed", hook="identify")
            flow.metadata.pop(IDENTITY_KEY, None)
            flow.response = denied_response(Reason.INTERNAL_ERROR, None, "-")

    async def _refuse(self, flow: http.HTTPFlow, state: ConnectionState | None) -> None:
        dctx = DecisionContext(
            phase=Phase.CONNECT if flow.request.method == "CONNECT" else Phase.REQUEST,
            listener=state.listener if state else flow.client_conn.proxy_mode.full_spec,
            client=state.client if state else client_address(flow.client_conn.peername),
            host=flow.request.host,
            port=flow.request.port,
            method=flow.request.method,
            path=None if flow.request.method == "CONNECT" else flow.request.path,
        )
        decision = Decision(allowed=False, reason=Reason.NO_IDENTITY, policy_version=self.ctx.policy.version)
        if not await refuse(self.ctx.audit, flow, proxy_auth_required(dctx.decision_id), dctx, decision):
            flow.response = denied_response(Reason.INTERNAL_ERROR, None, dctx.decision_id)


def client_address(peer: tuple[str, int] | object | None) -> str:
    """`host:port` (`[v6]:port`) of a peer address as records show it; `-` when unknown."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return "-"
