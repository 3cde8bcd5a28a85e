"""Addon: decide a tunnel at each of its layers: the CONNECT, its TLS ClientHello, raw TCP in it.

- CONNECT: decide on the target; a denied host gets 403 and no upstream connection; an
  allowed one is pinned to the address the gateway resolved and checked. A CONNECT the
  passthrough front decided before it handed the connection over goes on with the front's
  decision (`GatewayContext.front_decided`), not a second one; one it recorded too (it
  answered 200 itself) is not recorded again.
- TLS ClientHello: the SNI must name the allowed host (`sni_mismatch`); hosts that need no
  inspection are passed through untouched, the rest intercepted with the gateway's CA.
- Raw TCP: bytes pass only where a `protocol: tcp` rule allowed the connection.
A CONNECT an `ask` rule matched is held for an operator (sandgate.proxy.approvals.holds).
Every hook is guarded: an exception denies with `internal_error`, never lets traffic through.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import structlog
from mitmproxy import connection, http, tcp
from mitmproxy.tls import ClientHelloData

from sandgate.policy.decision import Decision, EgressRequest, Phase
from sandgate.policy.errors import HostError
from sandgate.policy.hosts import normalise_host
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.exchange import exchange_context
from sandgate.proxy.addons.guest_peer import peer_ip, source_key
from sandgate.proxy.addons.refusal import refuse_flow
from sandgate.proxy.addons.tunnel_rules import tls_decision
from sandgate.proxy.approvals.holds import Holds
from sandgate.proxy.approvals.reserved import ReservedName
from sandgate.proxy.audit.records import DecisionContext, decision_record
from sandgate.proxy.context import ConnectionState, GatewayContext
from sandgate.proxy.mitm.closer import ConnectionCloser

__all__ = ["TunnelGate"]

log = structlog.get_logger("sandgate.gate")


class TunnelGate:
    """Decides at CONNECT and ClientHello, and refuses raw TCP nothing allowed."""

    def __init__(
        self,
        ctx: GatewayContext,
        holds: Holds,
        *,
        require_sni: bool = True,
        closer: ConnectionCloser | None = None,
        reserved: ReservedName | None = None,
    ) -> None:
        self.ctx = ctx
        self.holds = holds
        # Passthrough tunnels to hosts allowed by name need an SNI naming the host.
        self.require_sni = require_sni
        # Closes both sides of a connection whose upstream is already open (after a 101).
        self.closer = closer
        # The reserved name's endpoint, named in a refusal an approval could change.
        self.reserved = reserved

    # -- CONNECT -----------------------------------------------------------------------------

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.error is not None:
            return
        state = self.ctx.connections.get(flow.client_conn.id)
        dctx = exchange_context(state, flow.client_conn, Phase.CONNECT, flow=flow, request_line=False)
        try:
            if state is None:
                raise RuntimeError("no state for client connection")
            if state.transparent:
                # A guest behind the transparent listener does not get an explicit proxy too.
                denial = self._fault(Reason.PROTOCOL_NOT_ALLOWED, "CONNECT in transparent mode")
                await self._deny(flow, dctx, denial)
                return
            try:
                host = normalise_host(flow.request.host)
            except HostError as e:
                await self._deny(flow, dctx, self._fault(Reason.INVALID_REQUEST, str(e)))
                return
            dctx = replace(dctx, host=host, port=flow.request.port)
            handed = self.ctx.front_decided.pop(flow.client_conn.peername, None)
            reused = (
                handed.reusable(dctx.identity, host, flow.request.port, self.ctx.policy.version)
                if handed
                else None
            )
            decision, dctx = (reused, dctx) if reused is not None else await self._decide(flow, dctx, state)
            if not decision.allowed or decision.address is None:
                await self._deny(flow, dctx, decision)
                return
            # A tunnel the front allowed and recorded, handed over with its CONNECT replayed (its
            # first bytes were not a ClientHello): recorded once, by the front.
            recorded = handed is not None and handed.recorded
            if not recorded and not await self._record(dctx, decision):
                await self._deny(
                    flow, dctx, Decision.internal_error(self.ctx.policy.version, "audit queue full")
                )
                return
            state.tunnel_approved(host, flow.request.port, decision)
            # Dial exactly the address that was checked: mitmproxy never resolves the name.
            flow.request.data.host = decision.address
        except Exception:
            log.exception("hook_failed", hook="http_connect")
            await self._deny(flow, dctx, Decision.internal_error(self.ctx.policy.version, "hook failed"))

    async def _decide(
        self, flow: http.HTTPFlow, dctx: DecisionContext, state: ConnectionState
    ) -> tuple[Decision, DecisionContext]:
        """The CONNECT's decision (held for an operator when asked about), and its context."""
        assert dctx.host is not None and dctx.port is not None
        host, port = dctx.host, dctx.port
        request = EgressRequest(Phase.CONNECT, host, port, client=peer_ip(flow.client_conn.peername))
        decision = await self.ctx.decide(dctx.identity, request)
        if decision.ask:
            decision, dctx = await self.holds.hold(flow.client_conn, dctx, decision, state)
            self.holds.approved_tunnel(flow.client_conn, host, port, decision)
        return self.ctx.with_credentials(decision, dctx.identity, host, port), dctx

    # -- TLS ClientHello ---------------------------------------------------------------------

    async def tls_clienthello(self, data: ClientHelloData) -> None:
        client = data.context.client
        state = self.ctx.connections.get(client.id)
        if state is not None and state.transparent:
            return  # the Transparent addon decides ClientHellos on transparent connections
        try:
            if state is None or not state.in_tunnel or state.tunnel_decision is None:
                # TLS straight at the proxy port, or a connection we know nothing about.
                if state is not None and not state.in_tunnel:
                    self._record_tls_at_proxy_port(client)
                _block(state, Reason.PROTOCOL_NOT_ALLOWED)
                data.ignore_connection = True
                return
            raw_sni = data.client_hello.sni
            dctx = state.decision_context(Phase.TLS, sni=raw_sni)
            decision = tls_decision(
                raw_sni, state.tunnel_host, state.tunnel_decision, require_sni=self.require_sni
            )
            queued = await self._record(dctx, decision)
            if not decision.allowed or not queued:
                _block(state, decision.reason if queued else Reason.INTERNAL_ERROR)
                data.ignore_connection = True
                return
            state.tls_accepted(raw_sni, passthrough=not decision.inspect)
            data.ignore_connection = state.passthrough
        except Exception:
            log.exception("hook_failed", hook="tls_clienthello")
            _block(state, Reason.INTERNAL_ERROR)
            data.ignore_connection = True

    def _record_tls_at_proxy_port(self, client: connection.Client) -> None:
        """A TLS handshake sent to the explicit proxy instead of a request: `invalid_request`,
        recorded per source and second (anyone who can connect can repeat it at will)."""
        listener = client.proxy_mode.full_spec
        version = self.ctx.policy.version

        def record(source: str, count: int) -> dict[str, Any]:
            dctx = DecisionContext(phase=Phase.TLS, listener=listener, client=source)
            detail = "TLS sent to the proxy port: expected an HTTP request or CONNECT"
            rec = decision_record(
                dctx, Decision(reason=Reason.INVALID_REQUEST, policy_version=version, detail=detail)
            )
            rec["connections"] = count
            return rec

        self.ctx.refusals.refused(source_key(client.peername), "tls_at_proxy_port", record)

    # -- raw TCP in a tunnel -----------------------------------------------------------------

    async def tcp_start(self, flow: tcp.TCPFlow) -> None:
        # Passed-through TLS never gets here; raw bytes pass only where a `protocol: tcp` rule
        # allowed this connection (at connect in transparent mode, or the CONNECT target).
        state = self.ctx.connections.get(flow.client_conn.id)
        if (
            state is not None
            and state.denied is None
            and (state.raw or (state.tunnel_decision is not None and state.tunnel_decision.raw_tcp))
        ):
            return
        try:
            dctx = exchange_context(state, flow.client_conn, Phase.CONNECT)
            version = self.ctx.policy.version
            await self._record(dctx, Decision(reason=Reason.PROTOCOL_NOT_ALLOWED, policy_version=version))
        except Exception:
            log.exception("hook_failed", hook="tcp_start")
        finally:
            _block(state, Reason.PROTOCOL_NOT_ALLOWED)
            flow.kill()
            # The TCP layer ignores kill, and an upstream opened before (a 101) stays open:
            # a denied stream is closed on both sides, never left flowing after its record.
            if self.closer is not None:
                self.closer.close(flow.client_conn, flow.server_conn)

    # -- the connection's end ----------------------------------------------------------------

    def client_disconnected(self, client: connection.Client) -> None:
        self.holds.client_gone(client)

    # -- helpers -----------------------------------------------------------------------------

    def _fault(self, reason: Reason, detail: str) -> Decision:
        return Decision(allowed=False, reason=reason, policy_version=self.ctx.policy.version, detail=detail)

    async def _record(self, dctx: DecisionContext, decision: Decision) -> bool:
        return await self.ctx.audit.emit(decision_record(dctx, decision))

    async def _deny(self, flow: http.HTTPFlow, dctx: DecisionContext, decision: Decision) -> None:
        await refuse_flow(self.ctx, flow, dctx, decision, self.reserved)


def _block(state: ConnectionState | None, reason: Reason) -> None:
    if state is not None:
        state.refused(reason)
