"""One exchange per flow: what sandgate's addons know about one request, under one metadata key.

Every fact an addon hands to a later one travels in the flow's `Exchange` (`Exchange.of(flow)`),
and its audit record is written through it, so "exactly one record per exchange" is this
object's rule, not each addon's:

    allowed(audit, dctx, decision)   the request gate's pass: a place reserved for the record
                                     (its intent journaled); the exchange is pending
    refuse(audit, flow, answer, d)   answer the guest, then record the denial (with the pending
                                     context when there is one); refuse_now: from a body stream
    complete(audit, build)           the pending exchange ended: its record, as `build` makes it
    covered(release)                 another record stands for it (an aggregate that names it)

An exchange is recorded at most once: after any of refuse, complete or covered, the others
write nothing (a later refusal still answers the guest). `allowed` comes at most once, first.
`exchange_context` is the one way to build a decision's context from a flow or a connection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mitmproxy import connection, http

from sandgate.policy.decision import Decision, Identity, Phase
from sandgate.policy.protocols.list_filter import ListCalls
from sandgate.proxy.addons.guest_peer import client_address
from sandgate.proxy.audit.records import DecisionContext, decision_record, intent_record
from sandgate.proxy.audit.trail import AuditLog
from sandgate.proxy.context import ConnectionState

__all__ = [
    "CUT_BY_SHUTDOWN",
    "EXCHANGE_KEY",
    "DialPermit",
    "Exchange",
    "Record",
    "Scrubbed",
    "StreamedBytes",
    "exchange_context",
]

EXCHANGE_KEY = "sandgate.exchange"
# The record's `error` of an allowed exchange the drain cut (or a held one it ended).
CUT_BY_SHUTDOWN = "cut by shutdown"

Record = dict[str, Any]
# A dial the request gate permitted for one request outside a tunnel: (address, port, the host
# permitted there before), so a later refusal of that request withdraws it again.
DialPermit = tuple[str, int, str | None]
# Whose secrets a response is scrubbed of: (tenant, sandbox).
Owner = tuple[str, str]


@dataclass(slots=True)
class StreamedBytes:
    """Body bytes streamed to the upstream (`up`) and to the guest (`down`)."""

    up: int = 0
    down: int = 0


@dataclass(slots=True)
class Scrubbed:
    """The real secrets replaced in one exchange's response (or its WebSocket session) so far,
    by placeholder (never the value), for its `secret_scrubbed` finding record."""

    dctx: DecisionContext
    tally: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class Exchange:
    """One request's facts, set by the addon named beside each, and its one audit record."""

    # Identify (Transparent in transparent mode): who sent this request.
    identity: Identity | None = None
    # RequestGate: the request line and headers as the guest sent them, in bytes.
    head_bytes: int = 0
    # RequestGate: the dial it permitted for this request (see DialPermit).
    permit: DialPermit | None = None
    # RequestGate: a proposal to the reserved endpoint, answered once its body is in.
    proposal: DecisionContext | None = None
    # The HTTP seam: body bytes it streamed each way (a streamed body is not kept to count).
    streamed: StreamedBytes = field(default_factory=StreamedBytes)
    # An addon that refused what the upstream answered: the record's `error` (a fixed text).
    failure: str | None = None
    # The credential broker: credentials injected and their injectors' kinds.
    credentials: tuple[str, ...] = ()
    injectors: tuple[str, ...] = ()
    # The credential broker: it planned this request; whose secrets the response body, its
    # trailers and a WebSocket on it are scrubbed of.
    brokered: bool = False
    scrub: Owner | None = None
    scrub_trailers: Owner | None = None
    scrub_websocket: Owner | None = None
    # The credential broker: what its scrubbing replaced, reported once the answer ends.
    scrubbed: Scrubbed | None = None
    # AgentProtocols: what the request's JSON-RPC messages asked and how they were decided
    # (`mcp` or `jsonrpc`), for the exchange's record, allowed or refused.
    extra: dict[str, object] = field(default_factory=dict)
    # AgentProtocols: a body of unknown length it held and decided as it streamed.
    body_decided: bool = False
    # AgentProtocols: the request's allowed MCP list calls, whose answers AgentListFilter
    # filters; `list_answer`: those whose buffered answer it filters once it is whole.
    lists: ListCalls | None = None
    list_answer: ListCalls | None = None
    # AgentProtocols: the allowed body as it was read and decided (McpBody, RpcBody or the
    # GraphQL requests), for the credential broker (which tool a placeholder is sent to).
    messages_read: object | None = None
    # Upgrades: the approved WebSocket session, and a refused 101's (host, decision id).
    websocket: object | None = None
    switch_refused: tuple[str | None, str] | None = None
    _pending: tuple[DecisionContext, Decision] | None = None
    _recorded: bool = False

    @staticmethod
    def of(flow: http.HTTPFlow) -> Exchange:
        """The flow's exchange (a new one on its first use)."""
        exchange = flow.metadata.get(EXCHANGE_KEY)
        if not isinstance(exchange, Exchange):
            exchange = flow.metadata[EXCHANGE_KEY] = Exchange()
        return exchange

    # -- reading -----------------------------------------------------------------------------

    @property
    def pending(self) -> tuple[DecisionContext, Decision] | None:
        """The allowed exchange's (context, decision), its record still to write; else None."""
        return self._pending

    @property
    def recorded(self) -> bool:
        return self._recorded

    # -- transitions -------------------------------------------------------------------------

    async def allowed(self, audit: AuditLog, dctx: DecisionContext, decision: Decision) -> bool:
        """The request gate let it go: a place reserved for its one record (the record as known
        now journaled too); False when there was none (nothing is pending: refuse it)."""
        if self._pending is not None or self._recorded:
            raise RuntimeError("an exchange is allowed once, before its record")
        if not await audit.reserve(dctx.decision_id, intent_record(dctx, decision)):
            return False
        self._pending = (dctx, decision)
        return True

    async def refuse(
        self,
        audit: AuditLog,
        flow: http.HTTPFlow,
        response: http.Response,
        decision: Decision,
        dctx: DecisionContext | None = None,
        *,
        status: int | None = None,
        bytes_up: int | None = None,
        error: str | None = None,
        credentials: tuple[str, ...] = (),
        extra: Mapping[str, object] | None = None,
    ) -> bool:
        """Answer `flow` with `response` first (a fault while recording never lets the request
        go), then record the denial `decision` once; whether the record was queued (or written
        before). Its context: the pending one when the exchange was allowed, else `dctx`."""
        flow.response = response
        record = self._denial(decision, dctx, status, bytes_up, error, credentials, extra)
        return True if record is None else await audit.emit(record)

    def refuse_now(
        self,
        audit: AuditLog,
        flow: http.HTTPFlow,
        response: http.Response,
        decision: Decision,
        dctx: DecisionContext | None = None,
        *,
        status: int | None = None,
        credentials: tuple[str, ...] = (),
    ) -> None:
        """`refuse` from synchronous code (a body stream): the record is queued without waiting."""
        flow.response = response
        record = self._denial(decision, dctx, status, None, None, credentials, None)
        if record is not None:
            audit.emit_nowait(record)

    async def complete(self, audit: AuditLog, build: Callable[[DecisionContext, Decision], Record]) -> bool:
        """The allowed exchange ended: write its one record, as `build` makes it from the pending
        context and decision. False: nothing was pending (refused, or recorded already)."""
        pending = self._take()
        if pending is None:
            return False
        await audit.emit(build(*pending))
        return True

    def complete_nowait(self, audit: AuditLog, build: Callable[[DecisionContext, Decision], Record]) -> bool:
        """`complete` without waiting (the drain's cut, a process about to stop)."""
        pending = self._take()
        if pending is None:
            return False
        audit.emit_nowait(build(*pending))
        return True

    def covered(self) -> str | None:
        """Another record stands for this exchange (an aggregate that names it; `AuditLog.cover`
        gives back the place reserved for its own). Its decision id, or None when nothing was
        pending."""
        pending = self._take()
        return None if pending is None else pending[0].decision_id

    def permit_dial(self, state: ConnectionState, address: str, port: int, host: str) -> None:
        """Let the connection dial address:port for this request, remembered for `withdraw_dial`."""
        self.permit = (address, port, state.permit_dial(address, port, host))

    def withdraw_dial(self, state: ConnectionState | None) -> None:
        """This request was refused after its dial was permitted: the permission is withdrawn."""
        permit, self.permit = self.permit, None
        if permit is not None and state is not None:
            state.withdraw(*permit)

    def _take(self) -> tuple[DecisionContext, Decision] | None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._recorded = True
        return pending

    def _denial(
        self,
        decision: Decision,
        dctx: DecisionContext | None,
        status: int | None,
        bytes_up: int | None,
        error: str | None,
        credentials: tuple[str, ...],
        extra: Mapping[str, object] | None,
    ) -> Record | None:
        """The denial's record, once: None when the exchange was recorded before."""
        if self._recorded:
            return None
        pending = self._take()
        self._recorded = True
        context = pending[0] if pending is not None else dctx
        if context is None:
            raise ValueError("refusing an exchange nobody decided needs its context")
        record = decision_record(
            context, decision, status=status, bytes_up=bytes_up, error=error, credentials=credentials
        )
        record.update(self.extra)
        if extra:
            record.update(extra)
        return record


def exchange_context(
    state: ConnectionState | None,
    client: connection.Client,
    phase: Phase,
    *,
    flow: http.HTTPFlow | None = None,
    own_target: bool = False,
    request_line: bool = True,
) -> DecisionContext:
    """The context of a decision on `client`'s connection, or on `flow`, a request on it.

    Who: the flow's identity (Identify's, per request), else the connection's. From where: the
    connection's listener and address. To where: the connection's tunnel; a flow outside one
    (or any flow, `own_target`) names its own host and port. What: the flow's method and path
    (`request_line`; a CONNECT has no path).
    """
    if state is not None:
        listener, address, identity = state.listener, state.client, state.identity
        host, port = state.tunnel_host, state.tunnel_port
    else:
        listener, address, identity = client.proxy_mode.full_spec, client_address(client.peername), None
        host = port = None
    if flow is None:
        return DecisionContext(phase, listener, address, host=host, port=port, identity=identity)
    request = flow.request
    if own_target or state is None or not state.in_tunnel:
        host, port = request.host, request.port
    return DecisionContext(
        phase,
        listener,
        address,
        host=host,
        port=port,
        method=request.method if request_line else None,
        path=request.path if request_line and phase is not Phase.CONNECT else None,
        identity=Exchange.of(flow).identity,
    )
