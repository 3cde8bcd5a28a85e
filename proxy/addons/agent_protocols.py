"""Addon: MCP and JSON-RPC requests over HTTP, decided message by message before they go upstream.

A request an allow rule with an `mcp:` or `jsonrpc:` section allowed carries that section on
its decision (`Decision.messages`). Its body, whatever its Content-Type says, is then read the
one strict way (sandgate.policy.protocols) and decided; the addon only feeds bytes in and
writes answers out:

- the body is decoded from its Content-Encoding (gzip, deflate, br, zstd; stacked or unknown
  encodings cannot be read and are refused) and read within MAX_BODY bytes, encoded and
  decoded; a declared length over it is refused at the head, a decoded body over it too;
- a body of unknown length (chunked, HTTP/2 without Content-Length) is held back chunk by
  chunk (the upstream has the head, nothing of the body) and decided when it ends;
- a request with no body passes (a GET that opens MCP's event stream, a DELETE that ends a
  session), unless its query carries JSON-RPC (`jsonrpc`, `method` or `params`); a POST, PUT
  or PATCH without a body is no JSON-RPC message: `invalid_request`;
- whatever cannot be read where the rule needs it is `invalid_request`, never forwarded.

A refused body is answered in its protocol: JSON-RPC errors, one per request id, in an HTTP
200 (`application/json`; 202 and no body when only notifications were refused), never a 403
that would end an MCP session; the exchange records the denial once. An `ask` verdict is
refused (`approval_required`) for now: holding one tool call for a person comes later. In
report mode a refused body goes on and its record says `would_deny`.

Every record of such an exchange (allowed or refused) carries `mcp` or `jsonrpc`: the verdict,
reason and protocol rule, the batch size, and per message its method, tool, id and
`arguments_sha256` (of the arguments' canonical JSON), never an argument's value.
The allowed `tools/list`, `resources/list` and `prompts/list` calls it read are kept on the
exchange (`Exchange.lists`) for AgentListFilter (sandgate.proxy.addons.agent_lists), which
filters their answers (not in report mode: nothing is enforced there).

After the request gate and the tenant limits (it counts only what they let go), before the
credential broker (placeholders are swapped only in a body that was decided). Every hook is
guarded: a fault denies with `internal_error`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from mitmproxy import http

from sandgate.policy.decision import Decision, Mode
from sandgate.policy.protocols.decide import BodyVerdict
from sandgate.policy.protocols.errors import Problem
from sandgate.policy.protocols.list_filter import list_calls
from sandgate.policy.protocols.mcp import McpBody
from sandgate.policy.protocols.rules import GraphqlSection, McpSection
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.limits import body_length_unknown, declared_length
from sandgate.proxy.addons.protocol_bodies import (
    MAX_BODY,
    ReadBody,
    Section,
    Unreadable,
    body_facts,
    decide_body,
    refusal_response,
    unreadable_verdict,
)
from sandgate.proxy.audit.records import DecisionContext
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.respond import decision_response

__all__ = ["AgentProtocols", "ProtocolBodyRefused"]

log = structlog.get_logger("sandgate.agent_protocols")

# Query parameters that make a request JSON-RPC over GET (a method and its params in the URL).
_QUERY_RPC = frozenset({"jsonrpc", "method", "params"})
_QUERY_GRAPHQL = frozenset({"query", "operationname", "variables", "extensions"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class ProtocolBodyRefused(Exception):
    """Raised from a request body stream to abort it: the body was refused (already answered)."""


@dataclass(slots=True)
class _Held:
    """A body of unknown length held back until it ends, then decided (once)."""

    buffer: bytearray = field(default_factory=bytearray)
    done: bool = False


class AgentProtocols:
    """Decides the JSON-RPC messages of requests whose allow rule has `mcp:` or `jsonrpc:`."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        found = _governed(flow)
        if found is None:
            return
        exchange, dctx, decision, section = found
        try:
            request = flow.request
            if _rpc_query(request, section):
                problem = Unreadable("a call in the query string: send it as a POST body")
                verdict = unreadable_verdict(problem)
                await self._refuse(flow, exchange, dctx, decision, section, verdict, None)
                return
            length = declared_length(request)
            if length is not None and length > MAX_BODY:
                verdict = unreadable_verdict(
                    Unreadable(
                        f"a body of {length} bytes, over the {MAX_BODY} a rule reads", Problem.TOO_LARGE
                    ),
                )
                await self._refuse(flow, exchange, dctx, decision, section, verdict, None)
                return
            if body_length_unknown(request):
                held = _Held()
                request.stream = self._holder(flow, exchange, dctx, decision, section, held, request.stream)
        except Exception:
            log.exception("hook_failed", hook="agent_protocols.requestheaders", decision_id=dctx.decision_id)
            await self._fault(flow, exchange, dctx, decision)

    async def request(self, flow: http.HTTPFlow) -> None:
        found = _governed(flow)
        if found is None:
            return
        exchange, dctx, decision, section = found
        if exchange.body_decided:
            return  # decided as it streamed
        try:
            raw = flow.request.raw_content or b""
            if not raw and flow.request.method not in _BODY_METHODS:
                return  # nothing to decide: an event stream opened, a session ended
            verdict, body = decide_body(section, raw, flow.request.headers.get("content-encoding"))
            if verdict.allowed:
                _note(exchange, section, verdict, body, decision, dctx.decision_id)
                return
            await self._refuse(flow, exchange, dctx, decision, section, verdict, body)
        except Exception:
            log.exception("hook_failed", hook="agent_protocols.request", decision_id=dctx.decision_id)
            await self._fault(flow, exchange, dctx, decision)

    def _holder(
        self,
        flow: http.HTTPFlow,
        exchange: Exchange,
        dctx: DecisionContext,
        decision: Decision,
        section: Section,
        held: _Held,
        before: Any,
    ) -> Callable[[bytes], bytes]:
        """A request body stream that sends nothing until the body has ended and is allowed.

        The chunk that passes MAX_BODY, a refused body, and any byte after a decided one raise
        (the HTTP error seam cuts the upstream and sends the answer set here)."""
        metered = before if callable(before) else None

        def hold(chunk: bytes) -> bytes:
            if metered is not None:
                out = metered(chunk)
                chunk = out if isinstance(out, bytes) else b"".join(out)
            if held.done:
                if chunk:
                    self._refuse_now(
                        flow,
                        exchange,
                        dctx,
                        decision,
                        section,
                        unreadable_verdict(Unreadable("bytes after the body that was decided")),
                        None,
                    )
                    raise ProtocolBodyRefused(Reason.INVALID_REQUEST.value)
                return b""
            if chunk:
                held.buffer += chunk
                if len(held.buffer) > MAX_BODY:
                    verdict = unreadable_verdict(
                        Unreadable(f"a body over the {MAX_BODY} bytes a rule reads", Problem.TOO_LARGE)
                    )
                    self._refuse_now(flow, exchange, dctx, decision, section, verdict, None)
                    raise ProtocolBodyRefused(Reason.INVALID_REQUEST.value)
                return b""
            # mitmproxy's end of the message (an empty chunk).
            held.done = exchange.body_decided = True
            body = bytes(held.buffer)
            held.buffer.clear()
            if not body and flow.request.method not in _BODY_METHODS:
                return b""
            verdict, read = decide_body(section, body, flow.request.headers.get("content-encoding"))
            if verdict.allowed:
                _note(exchange, section, verdict, read, decision, dctx.decision_id)
                return body
            if self._refuse_now(flow, exchange, dctx, decision, section, verdict, read):
                raise ProtocolBodyRefused(str(verdict.reason))
            return body

        return hold

    async def _refuse(
        self,
        flow: http.HTTPFlow,
        exchange: Exchange,
        dctx: DecisionContext,
        decision: Decision,
        section: Section,
        verdict: BodyVerdict,
        body: ReadBody,
    ) -> None:
        """Answer the refused body in JSON-RPC, then record it once (report mode: it goes on)."""
        refusal = _refusal(exchange, dctx, decision, section, verdict, body)
        if refusal is None:
            return
        denial, response = refusal
        exchange.withdraw_dial(self.ctx.connections.get(flow.client_conn.id))
        await exchange.refuse(self.ctx.audit, flow, response, denial, status=response.status_code)

    def _refuse_now(
        self,
        flow: http.HTTPFlow,
        exchange: Exchange,
        dctx: DecisionContext,
        decision: Decision,
        section: Section,
        verdict: BodyVerdict,
        body: ReadBody,
    ) -> bool:
        """`_refuse` from a body stream; False in report mode (the body goes on)."""
        refusal = _refusal(exchange, dctx, decision, section, verdict, body)
        if refusal is None:
            return False
        denial, response = refusal
        exchange.refuse_now(self.ctx.audit, flow, response, denial, status=response.status_code)
        return True

    async def _fault(
        self, flow: http.HTTPFlow, exchange: Exchange, dctx: DecisionContext, decision: Decision
    ) -> None:
        fault = Decision.internal_error(decision.policy_version, "hook failed", mode=decision.mode)
        try:
            response = decision_response(fault, dctx.host, dctx.decision_id)
            await exchange.refuse(self.ctx.audit, flow, response, fault)
        finally:
            exchange.withdraw_dial(self.ctx.connections.get(flow.client_conn.id))


def _refusal(
    exchange: Exchange,
    dctx: DecisionContext,
    decision: Decision,
    section: Section,
    verdict: BodyVerdict,
    body: ReadBody,
) -> tuple[Decision, http.Response] | None:
    """The denial and its JSON-RPC answer for a refused body, its facts on the exchange's
    record; None in report mode (the body goes on, its record says would_deny)."""
    exchange.extra.update(body_facts(section, verdict, body, report=decision.mode is Mode.REPORT))
    if decision.mode is Mode.REPORT:
        return None
    denial = decision.as_denial(Reason(str(verdict.reason)), verdict.detail)
    return denial, refusal_response(section, verdict, dctx.decision_id)


def _governed(flow: http.HTTPFlow) -> tuple[Exchange, DecisionContext, Decision, Section] | None:
    """The allowed, unanswered exchange whose rule decides its messages, else None."""
    if flow.response is not None or flow.error is not None:
        return None
    exchange = Exchange.of(flow)
    pending = exchange.pending
    if pending is None or pending[1].messages is None:
        return None
    return exchange, pending[0], pending[1], pending[1].messages


def _rpc_query(request: http.Request, section: Section) -> bool:
    """Whether the query string carries a call: JSON-RPC's `method`, `params`, `jsonrpc`, or
    GraphQL's `query`, `operationName`, `variables`, `extensions` (a GET)."""
    keys = _QUERY_GRAPHQL if isinstance(section, GraphqlSection) else _QUERY_RPC
    return any(key.strip().lower() in keys for key in request.query)


def _note(
    exchange: Exchange,
    section: Section,
    verdict: BodyVerdict,
    body: ReadBody,
    decision: Decision,
    decision_id: str,
) -> None:
    """An allowed body's facts, for the exchange's record when it ends; its list calls, whose
    answers are filtered (not in report mode, where nothing the policy says is enforced)."""
    exchange.extra.update(body_facts(section, verdict, body, report=False))
    exchange.messages_read = body
    if isinstance(section, McpSection) and isinstance(body, McpBody) and decision.mode is not Mode.REPORT:
        exchange.lists = list_calls(section, body)
    log.debug("agent_protocols.allowed", decision_id=decision_id)
