"""Addon: the tenant's Rego on each message of a body an `mcp:`, `jsonrpc:` or `graphql:` rule
allowed (phase "message"): what the YAML section cannot say, said in Rego.

AgentProtocols (sandgate.proxy.addons.agent_protocols) reads and decides such a body first;
the body it allowed, as read, is on the exchange (`Exchange.messages_read`). When the
tenant's Rego reads the field that body fills (`input.mcp`, `input.jsonrpc`,
`input.graphql`; sandgate.proxy.addons.message_rego, shared with AgentWebsocket, which asks
the same of WebSocket messages), `data.sandgate.decision` is asked once per message (per
GraphQL operation) before the body goes upstream. A tenant whose modules never name that
field is not asked: it pays nothing here.

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

from sandgate.policy.decision import Decision, Mode
from sandgate.policy.protocols.decide import BodyVerdict, Verdict
from sandgate.policy.protocols.json_strict import JsonValue, loads_strict
from sandgate.policy.protocols.rules import GraphqlSection
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.message_input import graphql_variables
from sandgate.policy.rego.messages import MessagesVerdict, ReadMessages
from sandgate.policy.rego.program import RegoProgram
from sandgate.proxy.addons.agent_protocols import ProtocolBodyRefused
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.limits import body_length_unknown
from sandgate.proxy.addons.message_rego import (
    ask_messages,
    message_program,
    read_messages,
    record_detail,
    rego_facts,
)
from sandgate.proxy.addons.protocol_bodies import (
    DEFAULT_BOUNDS,
    BodyBounds,
    Section,
    body_facts,
    decoded,
    refusal_response,
)
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

    def __init__(self, ctx: GatewayContext, bounds: BodyBounds = DEFAULT_BOUNDS) -> None:
        self.ctx = ctx
        # The bounds AgentProtocols read the body within (GraphQL's variables are read again).
        self.bounds = bounds

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
                exchange.extra["rego"] = rego_facts("allow", verdict)
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
        body = read_messages(read, section)
        variables = _variables(flow, self.bounds) if isinstance(section, GraphqlSection) else ()
        verdict = await ask_messages(self.ctx, flow, dctx, decision, program, body, variables=variables)
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
        program = message_program(self.ctx, dctx.identity, section)
        if program is None:
            return None
        return exchange, dctx, decision, section, program

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
    exchange.extra["rego"] = rego_facts("would_deny" if report else "deny", verdict)
    if report:
        return None
    body_verdict = verdict.body
    denial = decision.as_denial(Reason(str(body_verdict.reason)), record_detail(verdict))
    return denial, refusal_response(section, body_verdict, dctx.decision_id)


def _variables(flow: http.HTTPFlow, bounds: BodyBounds) -> tuple[JsonValue, ...]:
    """Each GraphQL request's `variables`, from what AgentProtocols read (its reading keeps
    none): the body's bytes, or a GET's one `variables` parameter, by the same strict reader
    within the same bounds."""
    raw = flow.request.raw_content or b""
    if raw:
        data = decoded(raw, flow.request.headers.get("content-encoding"), bounds.max_body)
        return graphql_variables(loads_strict(data, bounds.json))
    given = flow.request.query.get_all("variables")
    if len(given) > 1:
        raise ValueError("'variables' given twice")
    return (loads_strict(given[0], bounds.json) if given else None,)
