"""Addon: decide at every layer, pin the checked address, and let nothing else out.

- CONNECT: decide on the target; a denied host gets 403 and no upstream connection; an
  allowed one is pinned to the address the gateway resolved and checked.
- TLS ClientHello: the SNI must name the approved host (`sni_mismatch`); hosts that need no
  inspection are passed through untouched, the rest intercepted with the gateway's CA.
- Every HTTP request: Host must name the connection's approved host (`host_mismatch`), then
  method and path; absolute-form proxy requests are decided (and resolved) one by one.
- server_connect is the chokepoint: an upstream connection opens only to an address this
  client connection was approved for, and never after a later layer denied.
An allowed request leaves its (context, decision) on the flow (`PENDING_KEY`), a place in
the audit queue reserved: TenantLimits (sandgate.proxy.addons.limits) counts it next, and
AuditCompletion writes its record when the exchange ends.
A decision to ask (an `ask` rule) holds the CONNECT or request here, the upstream not
contacted, until an operator decides (sandgate.proxy.approvals): approved, it goes on
exactly as an allowed one; denied, timed out or over the sandbox's cap, it is refused.
Requests to the gateway's own name (sandgate.proxy.approvals.reserved) are never decided as a
destination: the guests' endpoint answers them (sandgate.proxy.approvals.endpoint).
Every hook is guarded: an exception denies with `internal_error`, never lets traffic through.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import structlog
from mitmproxy import connection, http, tcp
from mitmproxy.connection import ConnectionState as WireState
from mitmproxy.proxy import server_hooks
from mitmproxy.tls import ClientHelloData

from sandgate.policy.decide import literal_ip
from sandgate.policy.decision import Decision, EgressRequest, Identity, Phase
from sandgate.policy.errors import HostError
from sandgate.policy.hosts import normalise_host, split_authority
from sandgate.policy.overrides import Decide, decide_readings
from sandgate.policy.paths import read_target
from sandgate.policy.reasons import Reason
from sandgate.policy.upgrade import requested_upgrade
from sandgate.proxy.addons.connection_limits import source_key
from sandgate.proxy.addons.drain import CUT_BY_SHUTDOWN, SHUTTING_DOWN, shutdown_response
from sandgate.proxy.addons.flow_keys import (
    APPROVAL_KEY,
    HEAD_BYTES_KEY,
    PENDING_KEY,
)
from sandgate.proxy.addons.hop_by_hop import strip_hop_by_hop
from sandgate.proxy.addons.identify import IDENTITY_KEY
from sandgate.proxy.addons.limits import (
    declared_length,
    head_bytes,
)
from sandgate.proxy.addons.refusal import refuse
from sandgate.proxy.approvals import AccessRequest, Approvals, QueueFull, State
from sandgate.proxy.approvals.endpoint import ENDPOINT_KEY, AccessEndpoint
from sandgate.proxy.audit.records import DecisionContext, decision_record, intent_record, new_decision_id
from sandgate.proxy.context import ConnectionState, GatewayContext, decision_context
from sandgate.proxy.mitm.closer import ConnectionCloser
from sandgate.proxy.respond import decision_response

# The flow keys are re-exported for the modules that have always imported them from here.
__all__ = ["Gate", "sni_problem", "tls_decision"]

log = structlog.get_logger("sandgate.gate")

DEFAULT_PORTS = {"http": 80, "https": 443}


class Gate:
    """Decides at CONNECT, ClientHello and per request; guards every upstream connection."""

    def __init__(
        self,
        ctx: GatewayContext,
        *,
        require_sni: bool = True,
        closer: ConnectionCloser | None = None,
        approvals: Approvals | None = None,
        endpoint: AccessEndpoint | None = None,
    ) -> None:
        self.ctx = ctx
        # Answers requests to the reserved name; None: no endpoint (and no name is reserved).
        self.endpoint = endpoint
        # Holds `ask` decisions for an operator; None: they are refused (approval_required).
        self.approvals = approvals
        # Requests held per client connection (their hold ends when it hangs up), and the
        # tunnels an approval opened: (host, port, approval) by client connection id.
        self._held: dict[str, set[AccessRequest]] = {}
        self._approved_tunnels: dict[str, tuple[str, int, tuple[str, str | None]]] = {}
        # Closes both sides of a connection whose upstream is already open (after a 101).
        self.closer = closer
        # Passthrough tunnels to hosts allowed by name need an SNI naming the host.
        self.require_sni = require_sni

    # -- CONNECT -----------------------------------------------------------------------------

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.error is not None:
            return
        dctx = self._context(flow, Phase.CONNECT)
        try:
            state = self._state(flow)
            if state.transparent:
                # A guest behind the transparent listener does not get an explicit proxy too.
                await self._deny_flow(
                    flow, dctx, self._fault(Reason.PROTOCOL_NOT_ALLOWED, "CONNECT in transparent mode")
                )
                return
            try:
                host = normalise_host(flow.request.host)
            except HostError as e:
                await self._deny_flow(flow, dctx, self._fault(Reason.INVALID_REQUEST, str(e)))
                return
            dctx.host, dctx.port = host, flow.request.port
            request = EgressRequest(Phase.CONNECT, host, flow.request.port, client=_client_ip(flow))
            decision = await self.ctx.decide(dctx.identity, request)
            if decision.ask:
                decision = await self._hold(flow, dctx, decision, state)
                if decision.approval is not None and decision.allowed:
                    approved = (host, flow.request.port, decision.approval)
                    self._approved_tunnels[flow.client_conn.id] = approved
            decision = self.ctx.with_credentials(decision, dctx.identity, host, flow.request.port)
            if not decision.allowed or decision.address is None:
                await self._deny_flow(flow, dctx, decision)
                return
            # A tunnel the passthrough front allowed and recorded, handed over with its CONNECT
            # replayed (its first bytes were not a ClientHello): decided again, recorded once.
            recorded = self.ctx.front_recorded.pop(flow.client_conn.peername, None) is not None
            if not recorded and not await self._record(dctx, decision):
                await self._deny_flow(flow, dctx, self._fault(Reason.INTERNAL_ERROR, "audit queue full"))
                return
            state.tunnel_approved(host, flow.request.port, decision)
            # Dial exactly the address that was checked: mitmproxy never resolves the name.
            flow.request.data.host = decision.address
        except Exception:
            log.exception("hook_failed", hook="http_connect")
            await self._deny_flow(flow, dctx, self._fault(Reason.INTERNAL_ERROR, "hook failed"))

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
                self._block(state, Reason.PROTOCOL_NOT_ALLOWED)
                data.ignore_connection = True
                return
            raw_sni = data.client_hello.sni
            dctx = state.decision_context(Phase.TLS)
            dctx.sni = raw_sni
            decision = tls_decision(
                raw_sni, state.tunnel_host, state.tunnel_decision, require_sni=self.require_sni
            )
            queued = await self._record(dctx, decision)
            if not decision.allowed or not queued:
                self._block(state, decision.reason if queued else Reason.INTERNAL_ERROR)
                data.ignore_connection = True
                return
            state.tls_accepted(raw_sni, passthrough=not decision.inspect)
            data.ignore_connection = state.passthrough
        except Exception:
            log.exception("hook_failed", hook="tls_clienthello")
            self._block(state, Reason.INTERNAL_ERROR)
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
        # approved this connection (at connect in transparent mode, or the CONNECT target).
        state = self.ctx.connections.get(flow.client_conn.id)
        if (
            state is not None
            and state.denied is None
            and (state.raw or (state.tunnel_decision is not None and state.tunnel_decision.raw_tcp))
        ):
            return
        try:
            dctx = decision_context(state, Phase.CONNECT)
            version = self.ctx.policy.version
            await self._record(dctx, Decision(reason=Reason.PROTOCOL_NOT_ALLOWED, policy_version=version))
        except Exception:
            log.exception("hook_failed", hook="tcp_start")
        finally:
            self._block(state, Reason.PROTOCOL_NOT_ALLOWED)
            flow.kill()
            # The TCP layer ignores kill, and an upstream opened before (a 101) stays open:
            # a denied stream is closed on both sides, never left flowing after its record.
            if self.closer is not None:
                self.closer.close(flow.client_conn, flow.server_conn)

    # -- HTTP requests -----------------------------------------------------------------------

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.error is not None:
            return
        dctx = self._context(flow, Phase.REQUEST)
        try:
            state = self._state(flow)
            strip_hop_by_hop(flow.request)
            # What the rules match is what the upstream gets: the normalised path, no fragment.
            reading = read_target(flow.request.path)
            flow.request.path = reading.forward
            dctx.method = flow.request.method
            dctx.path = flow.request.path
            flow.metadata[HEAD_BYTES_KEY] = head_bytes(flow.request)
            target = self._request_target(flow, state)
            if isinstance(target, Decision):
                await self._deny_flow(flow, dctx, target)
                return
            host, port, address = target
            dctx.host, dctx.port, dctx.sni = host, port, state.sni
            if self.endpoint is not None and host == self.endpoint.name and not state.in_tunnel:
                await self.endpoint.headers(flow, dctx, port)  # the gateway's own: never forwarded
                return
            headers = tuple(flow.request.headers.items(multi=True))
            request = EgressRequest(
                Phase.REQUEST,
                host,
                port,
                scheme=flow.request.scheme,
                method=flow.request.method,
                path=reading.path,
                sni=state.sni,
                query=reading.query,
                headers=headers,
                body_size=declared_length(flow.request),
                client=_client_ip(flow),
                upgrade=requested_upgrade(headers),
            )
            decision = await self.ctx.decide(dctx.identity, request, address=address)
            if decision.ask:
                tunnel = self._approved_tunnels.get(flow.client_conn.id) if state.in_tunnel else None
                decide: Decide = self.ctx.decide
                if tunnel is not None and tunnel[:2] == (host, port):
                    # The operator approved this tunnel: its requests are not asked about again.
                    decision = _released(decision, tunnel[2])
                    decide = _asks_released(self.ctx.decide, tunnel[2])
                else:
                    decision = await self._hold(flow, dctx, decision, state)
                if decision.allowed:
                    # Approved is this request as shown: another method it can mean (an override
                    # header) is decided too, and one that would be asked about is refused.
                    decision = await decide_readings(
                        decide, dctx.identity, request, decision, address=address
                    )
            elif decision.allowed:
                decision = await decide_readings(
                    self.ctx.decide, dctx.identity, request, decision, address=address
                )
            if not decision.allowed or decision.address is None:
                if reading.problem and not decision.detail:
                    decision = replace(decision, detail=reading.problem)
                await self._deny_flow(flow, dctx, decision)
                return
            # Nothing goes upstream without a place for its record (completed when it ends).
            # The record as known now is journaled too: a process killed before the record is
            # written leaves it for whoever settles its journal (sandgate.proxy.audit.intents).
            if not await self.ctx.audit.reserve(dctx.decision_id, intent_record(dctx, decision)):
                await self._deny_flow(flow, dctx, self._fault(Reason.INTERNAL_ERROR, "audit queue full"))
                return
            if not state.in_tunnel:
                before = state.approve(decision.address, port, host)
                flow.metadata[APPROVAL_KEY] = (decision.address, port, before)
                flow.request.data.host = decision.address
            flow.metadata[PENDING_KEY] = (dctx, decision)
        except Exception:
            log.exception("hook_failed", hook="requestheaders")
            await self._deny_flow(flow, dctx, self._fault(Reason.INTERNAL_ERROR, "hook failed"))

    async def request(self, flow: http.HTTPFlow) -> None:
        if self.endpoint is None or ENDPOINT_KEY not in flow.metadata or flow.response is not None:
            return
        try:
            await self.endpoint.answer(flow)
        except Exception:
            log.exception("hook_failed", hook="request")
            flow.metadata.pop(ENDPOINT_KEY, None)
            dctx = self._context(flow, Phase.REQUEST)
            await self._deny_flow(flow, dctx, self._fault(Reason.INTERNAL_ERROR, "hook failed"))

    def _request_target(
        self, flow: http.HTTPFlow, state: ConnectionState
    ) -> tuple[str, int, str | None] | Decision:
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

    # -- held for approval -------------------------------------------------------------------

    async def _hold(
        self, flow: http.HTTPFlow, dctx: DecisionContext, decision: Decision, state: ConnectionState
    ) -> Decision:
        """Hold an `ask` decision until an operator decides; the decision to go on with (allowed,
        carrying the approval, when approved), or the denial to answer with."""
        approvals, identity = self.approvals, dctx.identity
        if approvals is None or state.transparent or identity is None:
            # Transparent mode cannot hold a request yet: refused, saying what it would need.
            return decision.as_denial(Reason.APPROVAL_REQUIRED, "this request cannot be held for approval")
        try:
            request = approvals.hold(
                tenant=identity.tenant,
                sandbox=identity.sandbox,
                phase=dctx.phase.value,
                host=dctx.host or "",
                port=dctx.port or 0,
                method=dctx.method,
                path=dctx.path,
                rule_id=decision.rule_id,
            )
        except QueueFull:
            return decision.as_denial(Reason.APPROVAL_QUEUE_FULL, "too many requests held for approval")
        held = self._held.setdefault(flow.client_conn.id, set())
        try:
            # The held request's own record (decision `ask`), tied to its end's by `approval_id`.
            record = decision_record(replace(dctx, decision_id=new_decision_id()), decision)
            record["decision"] = "ask"
            record["approval_id"] = request.id
            if not await self.ctx.audit.emit(record):
                return self._fault(Reason.INTERNAL_ERROR, "audit queue full")
            log.info("approval.held", id=request.id, sandbox=request.sandbox, host=request.host)
            held.add(request)
            client = flow.client_conn
            # A client that hung up has its read side closed (mitmproxy sees the EOF at once).
            ended = await approvals.wait(request, lambda: not client.state & WireState.CAN_READ)
        finally:
            held.discard(request)
            # A fault or a cancelled hook ends the hold undecided: never left open, never released.
            approvals.drop(request)
        dctx.waited = request.waited
        approval = (request.id, request.by)
        if ended is State.APPROVED:
            return _released(decision, approval)
        if ended is State.CUT:
            return replace(decision.as_denial(Reason.INTERNAL_ERROR, SHUTTING_DOWN), approval=approval)
        reason, detail = {
            State.DENIED: (Reason.APPROVAL_DENIED, "an operator denied this request"),
            State.EXPIRED: (Reason.APPROVAL_TIMEOUT, "no decision in time"),
        }.get(ended, (Reason.APPROVAL_REQUIRED, "the client hung up while the request was held"))
        return replace(decision.as_denial(reason, detail), approval=approval)

    def client_disconnected(self, client: connection.Client) -> None:
        self._approved_tunnels.pop(client.id, None)
        held = self._held.pop(client.id, None)
        if held and self.approvals is not None:
            for request in list(held):
                self.approvals.client_gone(request)

    # -- the chokepoint ----------------------------------------------------------------------

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        try:
            state = self.ctx.connections.get(data.client.id)
            address = data.server.address
            if state is None or address is None:
                data.server.error = "sandgate: no approved destination"
                return
            if state.denied is not None:
                data.server.error = f"sandgate: {state.denied.value}"
                return
            approved_host = state.approved.get((str(address[0]), int(address[1])))
            if approved_host is None:
                data.server.error = "sandgate: destination not approved"
                return
            if data.server.sni is None or data.server.sni == address[0]:
                data.server.sni = approved_host
        except Exception:
            log.exception("hook_failed", hook="server_connect")
            data.server.error = "sandgate: internal error"

    # -- helpers -----------------------------------------------------------------------------

    def _state(self, flow: http.HTTPFlow) -> ConnectionState:
        state = self.ctx.connections.get(flow.client_conn.id)
        if state is None:
            raise RuntimeError("no state for client connection")
        return state

    def _context(self, flow: http.HTTPFlow, phase: Phase) -> DecisionContext:
        state = self.ctx.connections.get(flow.client_conn.id)
        dctx = decision_context(state, phase)
        if state is None or not state.in_tunnel:
            dctx.host, dctx.port = flow.request.host, flow.request.port
        # The request's identity (Identify sets it per request), not only the connection's.
        identity = flow.metadata.get(IDENTITY_KEY)
        dctx.identity = identity if isinstance(identity, Identity) else None
        return dctx

    def _fault(self, reason: Reason, detail: str) -> Decision:
        return Decision(allowed=False, reason=reason, policy_version=self.ctx.policy.version, detail=detail)

    async def _record(self, dctx: DecisionContext, decision: Decision) -> bool:
        return await self.ctx.audit.emit(decision_record(dctx, decision))

    async def _deny_flow(self, flow: http.HTTPFlow, dctx: DecisionContext, decision: Decision) -> None:
        if decision.reason is Reason.INTERNAL_ERROR and decision.detail == SHUTTING_DOWN:
            # A held request the drain ended: answered and recorded as other cut requests are.
            flow.response = shutdown_response(dctx.decision_id)
            await self.ctx.audit.emit(decision_record(dctx, decision, status=503, error=CUT_BY_SHUTDOWN))
            return
        state = self.ctx.connections.get(flow.client_conn.id)
        if flow.request.method == "CONNECT" and state is not None:
            state.refused(decision.reason)
        ask = None
        if self.endpoint is not None:
            ask = self.endpoint.reserved.ask(dctx.host, dctx.port, dctx.method, dctx.path)
        response = decision_response(decision, dctx.host, dctx.decision_id, ask=ask)
        await refuse(self.ctx.audit, flow, response, dctx, decision)

    def _block(self, state: ConnectionState | None, reason: Reason) -> None:
        if state is not None:
            state.refused(reason)


def tls_decision(sni: str | None, host: str | None, decision: Decision, *, require_sni: bool) -> Decision:
    """The decision on a tunnel's ClientHello: the tunnel's own, or `sni_mismatch` when the SNI
    does not fit it (see `sni_problem`)."""
    problem = sni_problem(sni, host, decision, require_sni=require_sni)
    if problem is None:
        return decision
    return Decision(
        reason=Reason.SNI_MISMATCH,
        policy_version=decision.policy_version,
        mode=decision.mode,
        address=decision.address,
        detail=problem,
    )


def sni_problem(sni: str | None, host: str | None, decision: Decision, *, require_sni: bool) -> str | None:
    """Why a ClientHello's SNI does not fit the tunnel, or None.

    A present SNI must name the CONNECT host (compared normalised: case, trailing dot). An
    absent one is accepted where the gateway sees every request anyway (intercepted), where
    a network rule allowed the address (a tunnel to an IP literal, any SNI will do), and on
    `protocol: tcp` tunnels (any bytes may pass). A passthrough tunnel to a name needs one:
    without it the server picks a default site and routes by the inner Host, which the
    gateway cannot see (domain fronting), unless the operator admits such clients.
    """
    if host is None:
        return "no tunnel host"
    if literal_ip(host) is not None:
        return None
    if sni is None:
        passthrough = not decision.inspect and not decision.raw_tcp
        return "no SNI on a passthrough tunnel" if passthrough and require_sni else None
    try:
        return None if normalise_host(sni) == host else "SNI does not name the CONNECT host"
    except HostError:
        return "SNI is not a host name"


def _released(decision: Decision, approval: tuple[str, str | None]) -> Decision:
    """An `ask` decision an operator approved: allowed, as it would have been by a rule."""
    return replace(decision, allowed=True, ask=False, reason=Reason.ALLOWED, approval=approval)


def _asks_released(decide: Decide, approval: tuple[str, str | None]) -> Decide:
    """`decide` inside a tunnel an operator approved: what it would ask about is allowed."""

    async def in_approved_tunnel(*args: Any, **kwargs: Any) -> Decision:
        decision = await decide(*args, **kwargs)
        return _released(decision, approval) if decision.ask else decision

    return in_approved_tunnel


def _client_ip(flow: http.HTTPFlow) -> str | None:
    peer = flow.client_conn.peername
    return str(peer[0]) if peer else None
