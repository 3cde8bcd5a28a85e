"""Addon: transparent mode, where guests do not know there is a proxy.

Identity comes from the source address (the host's nftables rules drop spoofed sources).
A guest connects to an IP and may claim any name in its SNI or Host: the claim is honoured
only if the gateway resolved that name to that IP for that sandbox (its DNS listener's
answers, or its own resolver); the connection is then dialled to the gateway's own pinned
address for the name. Anything else is `host_mismatch` (or, with `reroute`, dialled to the
pinned address anyway): the guest's chosen IP never decides where a name's bytes go.
A destination without a name (no SNI, no Host) is decided by `cidrs` rules alone.
The gateway's own name (sandgate.proxy.approvals.reserved) is never looked up: a request with
it as Host goes to the request gate, which answers it itself; TLS naming it is refused.
"""

from __future__ import annotations

from dataclasses import replace

import structlog
from mitmproxy import connection, http
from mitmproxy.proxy import layer, layers
from mitmproxy.tls import ClientHelloData

from sandgate.policy.decision import Decision, EgressRequest, Phase
from sandgate.policy.errors import HostError, ResolveError
from sandgate.policy.hosts import normalise_host, split_authority
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.approvals.reserved import ENDPOINT_PORT
from sandgate.proxy.audit.records import DecisionContext, decision_record
from sandgate.proxy.context import ConnectionState, GatewayContext
from sandgate.proxy.respond import denied_response

__all__ = ["Transparent"]

log = structlog.get_logger("sandgate.transparent")


class Transparent:
    """Identity, name binding and raw-TCP steering for transparent listeners."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    # -- connect -----------------------------------------------------------------------------

    async def client_connected(self, client: connection.Client) -> None:
        state = self.ctx.connections.get(client.id)
        if state is None or not state.transparent:
            return
        try:
            dst = client.sockname
            state.arrived(
                (str(dst[0]), int(dst[1])), self.ctx.policy.identify_address(str(client.peername[0]))
            )
            assert state.original_dst is not None
            decision = await self._connect_decision(state)
            if decision is None:
                return  # decided later, on the ClientHello or the HTTP request
            dctx = self._dctx(state, Phase.CONNECT, state.original_dst[0])
            queued = await self.ctx.audit.emit(decision_record(dctx, decision))
            if decision.allowed and queued and decision.address is not None:
                state.raw_approved(decision.address, state.original_dst[1], dctx.host or decision.address)
                return
            reason = decision.reason if queued else Reason.INTERNAL_ERROR
            state.refused(reason)
            client.error = f"sandgate: {reason.value}"
        except Exception:
            log.exception("hook_failed", hook="transparent.client_connected")
            if state is not None:
                state.refused(Reason.INTERNAL_ERROR)
            client.error = "sandgate: internal error"

    async def _connect_decision(self, state: ConnectionState) -> Decision | None:
        """The decision at connect, or None when the first bytes must decide (TLS, HTTP)."""
        assert state.original_dst is not None
        ip, port = state.original_dst
        policy = self.ctx.policy
        reserved = self.ctx.reserved
        if reserved is not None and (ip, port) == (reserved.address, ENDPOINT_PORT):
            return None  # the gateway's own endpoint, whatever ports the tenant's rules name
        if state.identity is None:
            return Decision(reason=Reason.NO_IDENTITY, policy_version=policy.version)
        tenant = policy.tenant(state.identity.tenant)
        if tenant is None:
            return Decision(reason=Reason.NO_IDENTITY, policy_version=policy.version)
        if not tenant.allow.allows_port(port):
            return Decision(
                reason=Reason.PROTOCOL_NOT_ALLOWED, policy_version=policy.version, mode=tenant.mode
            )
        if not tenant.allow.has_raw_tcp:
            return None  # no `protocol: tcp` rule to look for: the first bytes decide
        # Raw TCP rules: by network for the address itself, or by a name bound to it.
        by_ip = await self.ctx.decide(state.identity, EgressRequest(Phase.CONNECT, ip, port))
        if by_ip.allowed and by_ip.raw_tcp:
            return by_ip
        for name in self.ctx.bindings.names_for(state.identity.sandbox, ip):
            by_name = await self.ctx.decide(
                state.identity, EgressRequest(Phase.CONNECT, name, port), address=ip
            )
            if by_name.allowed and by_name.raw_tcp:
                return by_name
        return None

    # -- layer steering ----------------------------------------------------------------------

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        state = self.ctx.connections.get(nextlayer.context.client.id)
        if state is not None and state.transparent and state.raw and nextlayer.layer is None:
            # Approved raw TCP: bytes pass through, nothing is parsed.
            nextlayer.layer = layers.TCPLayer(nextlayer.context, ignore=True)

    # -- TLS ---------------------------------------------------------------------------------

    async def tls_clienthello(self, data: ClientHelloData) -> None:
        state = self.ctx.connections.get(data.context.client.id)
        if state is None or not state.transparent:
            return
        try:
            if state.raw:
                data.ignore_connection = True
                return
            assert state.original_dst is not None
            ip, port = state.original_dst
            sni = data.client_hello.sni
            dctx = replace(self._dctx(state, Phase.TLS, ip), sni=sni)
            decision, host = await self._decide_claim(state, sni)
            dctx = replace(dctx, host=host)
            queued = await self.ctx.audit.emit(decision_record(dctx, decision))
            if not decision.allowed or not queued or decision.address is None:
                state.refused(decision.reason if queued else Reason.INTERNAL_ERROR)
                data.ignore_connection = True
                return
            state.tunnel_approved(host, port, decision)
            state.tls_accepted(sni, passthrough=not decision.inspect or decision.raw_tcp)
            data.context.server.address = (decision.address, port)
            data.ignore_connection = state.passthrough
        except Exception:
            log.exception("hook_failed", hook="transparent.tls_clienthello")
            state.refused(Reason.INTERNAL_ERROR)
            data.ignore_connection = True

    # -- plaintext HTTP ----------------------------------------------------------------------

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        """Bind the Host claim to the original destination; the request gate then decides it."""
        state = self.ctx.connections.get(flow.client_conn.id)
        if state is None or not state.transparent or state.in_tunnel or flow.response is not None:
            return
        try:
            if state.identity is not None:
                Exchange.of(flow).identity = state.identity
            assert state.original_dst is not None
            ip, port = state.original_dst
            claimed = flow.request.host_header
            if claimed is None:
                return  # no name: the request gate decides the address by `cidrs` rules
            try:
                name, claimed_port = split_authority(claimed, port)
            except HostError as e:
                await self._deny(flow, state, Decision(reason=Reason.HOST_MISMATCH, detail=str(e)), claimed)
                return
            if claimed_port != port:
                await self._deny(flow, state, Decision(reason=Reason.HOST_MISMATCH), name)
                return
            reserved = self.ctx.reserved
            if reserved is not None and name == reserved.name:
                flow.request.data.host = name  # answered by the request gate itself, never resolved
                return
            if name != ip and not await self._bound(state, name):
                await self._deny(
                    flow,
                    state,
                    Decision(reason=Reason.HOST_MISMATCH, detail="not resolved by the gateway"),
                    name,
                )
                return
            # From here the request is decided like an absolute-form proxy request for `name`.
            flow.request.data.host = name
        except Exception:
            log.exception("hook_failed", hook="transparent.requestheaders")
            await self._deny(flow, state, Decision.internal_error(self.ctx.policy.version), None)

    # -- helpers -----------------------------------------------------------------------------

    async def _decide_claim(self, state: ConnectionState, sni: str | None) -> tuple[Decision, str]:
        """Decide a ClientHello: the SNI name if bound to the destination, else the address."""
        assert state.original_dst is not None
        ip, port = state.original_dst
        if sni is None:
            return await self.ctx.decide(state.identity, EgressRequest(Phase.TLS, ip, port)), ip
        try:
            name = normalise_host(sni)
        except HostError as e:
            return Decision(reason=Reason.SNI_MISMATCH, detail=str(e)), sni
        if name != ip and not await self._bound(state, name):
            return Decision(reason=Reason.HOST_MISMATCH, detail="not resolved by the gateway"), name
        decision = await self.ctx.decide(state.identity, EgressRequest(Phase.TLS, name, port, sni=sni))
        return self.ctx.with_credentials(decision, state.identity, name, port), name

    async def _bound(self, state: ConnectionState, name: str) -> bool:
        """Whether the gateway resolved `name` to the original destination for this sandbox.

        A name the tenant's rules never allow, or a deny rule refuses outright, counts as bound
        here: the decision that follows denies it (`host_not_allowed`, `host_denied`) without
        the gateway ever looking the name up.
        """
        if self.ctx.reroute:
            return True
        if self.ctx.reserved is not None and name == self.ctx.reserved.name:
            return True  # the decision refuses it (reserved_host): never looked up
        assert state.original_dst is not None
        if state.identity is None:
            return True  # the decision denies with no_identity
        ip = state.original_dst[0]
        if self.ctx.bindings.bound(state.identity.sandbox, ip, name):
            return True
        tenant = self.ctx.policy.tenant(state.identity.tenant)
        if tenant is None or not tenant.allow.names_host(name) or tenant.refuses_name(name) is not None:
            return True
        try:
            return ip in (await self.ctx.resolver.resolve(name)).addresses
        except ResolveError:
            return False

    def _dctx(self, state: ConnectionState, phase: Phase, host: str | None) -> DecisionContext:
        port = state.original_dst[1] if state.original_dst else None
        return replace(state.decision_context(phase), host=host, port=port)

    async def _deny(
        self, flow: http.HTTPFlow, state: ConnectionState, decision: Decision, host: str | None
    ) -> None:
        dctx = replace(
            self._dctx(state, Phase.REQUEST, host), method=flow.request.method, path=flow.request.path
        )
        decision = Decision(
            reason=decision.reason, policy_version=self.ctx.policy.version, detail=decision.detail
        )
        response = denied_response(decision.reason, host, dctx.decision_id)
        if not await Exchange.of(flow).refuse(self.ctx.audit, flow, response, decision, dctx):
            flow.response = denied_response(Reason.INTERNAL_ERROR, host, dctx.decision_id)
