"""Addon: the tenant's Rego on each message of a body an `mcp:`, `jsonrpc:` or `graphql:` rule
allowed (phase "message"): what the YAML section cannot say, said in Rego.

AgentProtocols (sandgate.proxy.addons.agent_protocols) reads and decides such a body first;
the body it allowed, as read, is on the exchange (`Exchange.messages_read`). When the
tenant's Rego reads the field that body fills (`input.mcp`, `input.jsonrpc`,
`input.graphql`; sandgate.policy.rego.messages.reads_messages), `data.sandgate.decision` is
asked once per message (per GraphQL operation) before the body goes upstream. A tenant whose
modules never name that field is not asked: it pays nothing here.

- A denied message refuses the body, all or nothing, as the YAML's refusals: JSON-RPC errors
  (one per request id, in an HTTP 200) or GraphQL errors, each naming the reason, the rule
  (`data.sandgate.decision`) and, in `detail`, the policy's message. The exchange records the
  denial once; its `mcp`/`jsonrpc`/`graphql` facts carry the verdicts, its `rego` object the
  phase, verdict and number of evaluations. The policy's message is not recorded (it may
  quote an argument): the record's detail names the refused member only.
- An engine fault or timeout refuses the body (`policy_error`), in report mode too; it is
  never forwarded undecided.
- Report mode: a denial is recorded (`would_deny`) and the body goes on.
- A body of unknown length (chunked, HTTP/2 without Content-Length) is decided by
  AgentProtocols as it streams, and is upstream by the time the `request` hook runs: when
  the tenant's Rego reads the body's field, such a POST, PUT or PATCH (or any chunked
  request) is refused at its head (`invalid_request`, "send Content-Length"), and on HTTP/2
  a request of another method is refused at its first body byte (an HTTP/2 GET without a
  body, MCP's event stream, goes on). Report mode records `would_deny` and lets it go.

After AgentProtocols (it needs the body that addon allowed), before AgentListFilter and the
credential broker (placeholders are swapped only into a body both decided). Every hook is
guarded: a fault denies with `internal_error`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from mitmproxy import http

from sandgate.policy.decide import default_engine
from sandgate.policy.decision import Decision, EgressRequest, Identity, Mode, Phase
from sandgate.policy.paths import read_target
from sandgate.policy.protocols.decide import BodyVerdict, Verdict
from sandgate.policy.protocols.graphql_ops import GraphqlRequest
from sandgate.policy.protocols.json_strict import JsonValue, loads_strict
from sandgate.policy.protocols.jsonrpc import RpcBody
from sandgate.policy.protocols.mcp import McpBody
from sandgate.policy.protocols.rules import GraphqlSection, McpSection
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.message_input import graphql_variables
from sandgate.policy.rego.messages import (
    REGO_RULE,
    MessagesVerdict,
    ReadMessages,
    decide_messages,
    message_inputs,
    protocol_of,
    reads_messages,
)
from sandgate.policy.rego.program import RegoProgram
from sandgate.policy.upgrade import requested_upgrade
from sandgate.proxy.addons.agent_protocols import ProtocolBodyRefused
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.guest_peer import peer_ip
from sandgate.proxy.addons.limits import body_length_unknown, declared_length
from sandgate.proxy.addons.protocol_bodies import Section, body_facts, decoded, refusal_response
from sandgate.proxy.audit.records import DecisionContext
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.respond import decision_response

__all__ = ["UNKNOWN_LENGTH", "AgentRego"]

log = structlog.get_logger("sandgate.agent_rego")

UNKNOWN_LENGTH = "a body of unknown length cannot be decided by the tenant's Rego; send Content-Length"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

# (exchange, its context, its decision, the rule's section, the tenant's program)
type Governed = tuple[Exchange, DecisionContext, Decision, Section, RegoProgram]


class AgentRego:
    """Asks the tenant's Rego about each message of a body an agent-protocol rule allowed."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        try:
            found = self._governed(flow)
            if found is None or not body_length_unknown(flow.request):
                return
            request = flow.request
            chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
            if chunked or request.method in _BODY_METHODS:
                await self._refuse(flow, found, _unknown_length(), None)
            else:
                request.stream = self._first_byte_refuses(flow, found, request.stream)
        except Exception:
            log.exception("hook_failed", hook="agent_rego.requestheaders")
            await self._fault(flow)

    async def request(self, flow: http.HTTPFlow) -> None:
        try:
            found = self._governed(flow)
            if found is None:
                return
            exchange = found[0]
            if exchange.body_decided or exchange.messages_read is None:
                return  # streamed (refused or let go at its head), or nothing was read and allowed
            verdict, body = await self._decide(flow, found, exchange.messages_read)
            if verdict.allowed:
                exchange.extra["rego"] = _rego_facts("allow", verdict)
                return
            await self._refuse(flow, found, verdict, body)
        except Exception:
            log.exception("hook_failed", hook="agent_rego.request")
            await self._fault(flow)

    async def _decide(
        self, flow: http.HTTPFlow, found: Governed, read: object
    ) -> tuple[MessagesVerdict, ReadMessages]:
        """The tenant's Rego on each message of the body AgentProtocols read and allowed."""
        _, dctx, decision, section, program = found
        body = _read_messages(read, section)
        variables = _variables(flow) if isinstance(section, GraphqlSection) else ()
        inputs = message_inputs(
            body, session_id=flow.request.headers.get("mcp-session-id"), variables=variables
        )
        identity = dctx.identity
        if identity is None or dctx.host is None or dctx.port is None:
            raise RuntimeError("an allowed exchange without its identity or destination")
        egress = _egress_request(flow, dctx, self._credentials(identity, dctx.host, dctx.port))
        engine = self.ctx.engine or default_engine()
        batch = body.batch if isinstance(body, McpBody | RpcBody) else len(body) > 1
        verdict = await decide_messages(
            engine, program, identity, egress, decision.address, inputs, batch=batch
        )
        return verdict, body

    def _governed(self, flow: http.HTTPFlow) -> Governed | None:
        """The allowed, unanswered exchange whose rule reads its messages and whose tenant's
        Rego reads the field they fill; else None."""
        if flow.response is not None or flow.error is not None:
            return None
        exchange = Exchange.of(flow)
        pending = exchange.pending
        if pending is None or pending[1].messages is None:
            return None
        dctx, decision = pending
        section = decision.messages
        assert section is not None
        tenant = self.ctx.policy.tenant(dctx.identity.tenant) if dctx.identity is not None else None
        program = tenant.rego if tenant is not None else None
        if program is None or not reads_messages(program, protocol_of(section)):
            return None
        return exchange, dctx, decision, section, program

    def _credentials(self, identity: Identity, host: str, port: int) -> tuple[str, ...]:
        """The credentials bound to the destination (Rego's `input.credentials`)."""
        broker = self.ctx.broker
        return broker.bound_names(identity.tenant, host, port) if broker is not None else ()

    def _first_byte_refuses(
        self, flow: http.HTTPFlow, found: Governed, inner: Any
    ) -> Callable[[bytes], bytes | list[bytes]]:
        """A request stream that refuses at the first body byte (before `inner`, AgentProtocols'
        holder, sees it); report mode records would_deny once and lets it through."""
        held = callable(inner)
        noted = False

        def guard(chunk: bytes) -> Any:
            nonlocal noted
            if chunk and not noted:
                noted = True
                try:
                    refused = self._refuse_now(flow, found)
                except Exception:
                    log.exception("hook_failed", hook="agent_rego.stream")
                    flow.response = decision_response(
                        Decision.internal_error(found[2].policy_version, "hook failed"),
                        None,
                        found[1].decision_id,
                    )
                    refused = True
                if refused:
                    raise ProtocolBodyRefused(Reason.INVALID_REQUEST.value)
            return inner(chunk) if held else chunk

        return guard

    async def _refuse(
        self, flow: http.HTTPFlow, found: Governed, verdict: MessagesVerdict, body: ReadMessages | None
    ) -> None:
        """Answer the refused body in its protocol and record it once; report mode (a denial,
        not a fault): note would_deny, the body goes on."""
        exchange, dctx, decision, section, _ = found
        refusal = _refusal(exchange, dctx, decision, section, verdict, body)
        if refusal is None:
            return
        denial, response = refusal
        exchange.lists = None
        exchange.withdraw_dial(self.ctx.connections.get(flow.client_conn.id))
        await exchange.refuse(self.ctx.audit, flow, response, denial, status=response.status_code)

    def _refuse_now(self, flow: http.HTTPFlow, found: Governed) -> bool:
        """`_refuse` of a body of unknown length from its stream; False in report mode."""
        exchange, dctx, decision, section, _ = found
        refusal = _refusal(exchange, dctx, decision, section, _unknown_length(), None)
        if refusal is None:
            return False
        denial, response = refusal
        exchange.lists = None
        exchange.refuse_now(self.ctx.audit, flow, response, denial, status=response.status_code)
        return True

    async def _fault(self, flow: http.HTTPFlow) -> None:
        """A hook failed: the allowed exchange is refused (`internal_error`), never let go."""
        exchange = Exchange.of(flow)
        pending = exchange.pending
        if pending is None:
            return  # nothing allowed it, or its refusal is recorded already
        dctx, decision = pending
        fault = Decision.internal_error(decision.policy_version, "hook failed", mode=decision.mode)
        try:
            exchange.lists = None
            response = decision_response(fault, dctx.host, dctx.decision_id)
            await exchange.refuse(self.ctx.audit, flow, response, fault)
        finally:
            exchange.withdraw_dial(self.ctx.connections.get(flow.client_conn.id))


def _unknown_length() -> MessagesVerdict:
    body = BodyVerdict(Verdict.DENY, Reason.INVALID_REQUEST, None, UNKNOWN_LENGTH)
    return MessagesVerdict(body, evaluated=0)


def _refusal(
    exchange: Exchange,
    dctx: DecisionContext,
    decision: Decision,
    section: Section,
    verdict: MessagesVerdict,
    body: ReadMessages | None,
) -> tuple[Decision, http.Response] | None:
    """The denial and its protocol answer, the facts on the exchange's record; None in report
    mode for a denial (never for a fault): the body goes on, recorded as would_deny."""
    report = decision.mode is Mode.REPORT and not verdict.fault
    exchange.extra.update(body_facts(section, verdict.body, body, report=report))
    exchange.extra["rego"] = _rego_facts("would_deny" if report else "deny", verdict)
    if report:
        return None
    body_verdict = verdict.body
    denial = decision.as_denial(Reason(str(body_verdict.reason)), _record_detail(verdict))
    return denial, refusal_response(section, body_verdict, dctx.decision_id)


def _record_detail(verdict: MessagesVerdict) -> str:
    """The record's detail: the refused member, never the policy's message (it may quote an
    argument); a fault's or an unknown length's own text (no request data in either)."""
    body = verdict.body
    if verdict.fault or verdict.evaluated == 0:
        return body.detail
    denied = next((m for m in body.messages if m.verdict is Verdict.DENY and m.rule == REGO_RULE), None)
    where = "the message" if denied is None or denied.index is None else f"batch member {denied.index}"
    return f"{REGO_RULE} denied {where} ({body.reason})"


def _rego_facts(outcome: str, verdict: MessagesVerdict) -> dict[str, object]:
    """The record's `rego` object: the phase, what came of it, how many evaluations."""
    facts: dict[str, object] = {"phase": "message", "verdict": outcome, "evaluated": verdict.evaluated}
    if outcome != "allow":
        facts.update(reason=str(verdict.body.reason), rule=verdict.body.rule)
    return facts


def _read_messages(read: object, section: Section) -> ReadMessages:
    """The body AgentProtocols read and allowed, of the kind its section reads."""
    if isinstance(section, McpSection):
        if isinstance(read, McpBody):
            return read
    elif isinstance(section, GraphqlSection):
        if isinstance(read, tuple) and all(isinstance(r, GraphqlRequest) for r in read):
            return read
    elif isinstance(read, RpcBody):
        return read
    raise TypeError(f"a {type(read).__name__} read for a {type(section).__name__}")


def _variables(flow: http.HTTPFlow) -> tuple[JsonValue, ...]:
    """Each GraphQL request's `variables`, from what AgentProtocols read (its reading keeps
    none): the body's bytes, or a GET's one `variables` parameter, by the same strict reader."""
    raw = flow.request.raw_content or b""
    if raw:
        data = decoded(raw, flow.request.headers.get("content-encoding"))
        return graphql_variables(loads_strict(data))
    given = flow.request.query.get_all("variables")
    if len(given) > 1:
        raise ValueError("'variables' given twice")
    return (loads_strict(given[0]) if given else None,)


def _egress_request(
    flow: http.HTTPFlow, dctx: DecisionContext, credentials: tuple[str, ...]
) -> EgressRequest:
    """The request as the request gate decided it (its input document's request fields)."""
    assert dctx.host is not None and dctx.port is not None
    target = read_target(flow.request.path)
    headers = tuple(flow.request.headers.items(multi=True))
    return EgressRequest(
        Phase.REQUEST,
        dctx.host,
        dctx.port,
        scheme=flow.request.scheme,
        method=flow.request.method,
        path=target.path,
        sni=dctx.sni,
        query=target.query,
        headers=headers,
        body_size=declared_length(flow.request),
        client=peer_ip(flow.client_conn.peername),
        credentials=credentials,
        upgrade=requested_upgrade(headers),
    )
