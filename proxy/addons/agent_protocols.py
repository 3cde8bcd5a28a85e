"""Addon: MCP and JSON-RPC requests over HTTP, decided message by message before they go upstream.

A request an allow rule with an `mcp:` or `jsonrpc:` section allowed carries that section on
its decision (`Decision.messages`). Its body, whatever its Content-Type says, is then read the
one strict way (sandgate.policy.protocols) and decided; the addon only feeds bytes in and
writes answers out:

- the body is decoded from its Content-Encoding (gzip, deflate, br, zstd; stacked or unknown
  encodings cannot be read and are refused) and read within the gateway's bounds (`BodyBounds`,
  the config's `agent_protocols:`: 1 MiB encoded and decoded, 64 levels of nesting, 64 batch
  members by default); a declared length over the bytes is refused at the head, a decoded body
  over them too;
- a body of unknown length (chunked, HTTP/2 without Content-Length) is held back chunk by
  chunk (the upstream has the head, nothing of the body) and decided when it ends;
- a request with no body passes (a GET that opens MCP's event stream, a DELETE that ends a
  session), unless its query carries JSON-RPC (`jsonrpc`, `method` or `params`); a POST, PUT
  or PATCH without a body is no JSON-RPC message: `invalid_request`;
- whatever cannot be read where the rule needs it is `invalid_request`, never forwarded.

A refused body is answered in its protocol: JSON-RPC errors, one per request id, in an HTTP
200 (`application/json`; 202 and no body when only notifications were refused), never a 403
that would end an MCP session; the exchange records the denial once. In report mode a
refused body goes on and its record says `would_deny`.

A body with a tool call an `mcp.tools.ask` glob matched (and nothing denied: a batch is held
whole) goes on at once when live tool grants allow every asked call (its record names the
grant: `approval.id`, and the grant's rule per call); else it is held for a person through
the request gate's Holds (the pending store, the webhook, the admin API; never approved
automatically), then forwarded as the very bytes that were decided, or refused as JSON-RPC
errors (`approval_denied`, `approval_timeout`, ...). Only a body read whole (a Content-Length)
is held: one of unknown length is decided in its stream callable, where nothing can wait, so
its asked calls are refused `approval_required`, saying to send a Content-Length.

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

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote_plus

import structlog
from mitmproxy import http

from sandgate.policy.decision import Decision, Mode
from sandgate.policy.model.grants import EMPTY_GRANTS, Grant
from sandgate.policy.paths import read_target
from sandgate.policy.protocols.decide import BodyVerdict, Verdict
from sandgate.policy.protocols.errors import Problem
from sandgate.policy.protocols.list_filter import list_calls
from sandgate.policy.protocols.mcp import McpBody
from sandgate.policy.protocols.rules import GraphqlSection, McpSection
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.limits import body_length_unknown, declared_length
from sandgate.proxy.addons.protocol_bodies import (
    DEFAULT_BOUNDS,
    BodyBounds,
    ReadBody,
    Section,
    Unreadable,
    arguments_digest,
    body_facts,
    decide_body,
    decide_graphql_get,
    refusal_response,
    unreadable_verdict,
)
from sandgate.proxy.approvals.holds import Holds
from sandgate.proxy.approvals.tool_calls import (
    Where,
    asked_calls,
    granted,
    refused_verdict,
    released_verdict,
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
# Why an asked tool call in a body of unknown length is refused rather than held.
NEEDS_LENGTH = (
    "a tool call that asks for approval is held only when its body has a Content-Length: "
    "send it with one (not chunked) to have it held"
)
NOT_HOLDABLE = "this tool call cannot be held for approval here"


class ProtocolBodyRefused(Exception):
    """Raised from a request body stream to abort it: the body was refused (already answered)."""


@dataclass(slots=True)
class _Held:
    """A body of unknown length held back until it ends, then decided (once)."""

    buffer: bytearray = field(default_factory=bytearray)
    done: bool = False


class AgentProtocols:
    """Decides the JSON-RPC messages of requests whose allow rule has `mcp:` or `jsonrpc:`."""

    def __init__(
        self, ctx: GatewayContext, holds: Holds | None = None, bounds: BodyBounds = DEFAULT_BOUNDS
    ) -> None:
        self.ctx = ctx
        # The gates' Holds (one for the pipeline); None: asked calls are refused approval_required.
        self.holds = holds
        self.bounds = bounds

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        found = _governed(flow)
        if found is None:
            return
        exchange, dctx, decision, section = found
        try:
            request = flow.request
            if _rpc_query(request, section):
                if not (isinstance(section, GraphqlSection) and request.method == "GET"):
                    problem = Unreadable("a call in the query string: send it as a POST body")
                    verdict = unreadable_verdict(problem)
                    await self._refuse(flow, exchange, dctx, decision, section, verdict, None)
                    return
                # GraphQL over HTTP's GET: the query string decided as the body it stands for
                # (a body beside it is decided on its own, as any body is).
                verdict, read = decide_graphql_get(section, request.path.partition("?")[2], self.bounds)
                if not verdict.allowed:
                    await self._refuse(flow, exchange, dctx, decision, section, verdict, read)
                    return
                _note(exchange, section, verdict, read, decision, dctx.decision_id)
            length, limit = declared_length(request), self.bounds.max_body
            if length is not None and length > limit:
                verdict = unreadable_verdict(
                    Unreadable(f"a body of {length} bytes, over the {limit} a rule reads", Problem.TOO_LARGE),
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
            encoding = flow.request.headers.get("content-encoding")
            verdict, body = decide_body(section, raw, encoding, self.bounds)
            if verdict.verdict is Verdict.ASK:
                grants = await self._taken(self._tool_grants(flow, dctx, verdict, body))
                verdict = _released_by(exchange, verdict, grants)
            if verdict.allowed:
                _note(exchange, section, verdict, body, decision, dctx.decision_id)
                return
            if verdict.verdict is Verdict.ASK and decision.mode is not Mode.REPORT:
                await self._hold(flow, exchange, dctx, decision, section, verdict, body)
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

        The chunk that passes the bounds' bytes, a refused body, and any byte after a decided one raise
        (the HTTP error seam cuts the upstream and sends the answer set here)."""
        metered = before if callable(before) else None
        bounds = self.bounds

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
                if len(held.buffer) > bounds.max_body:
                    verdict = unreadable_verdict(
                        Unreadable(f"a body over the {bounds.max_body} bytes a rule reads", Problem.TOO_LARGE)
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
            verdict, read = decide_body(section, body, flow.request.headers.get("content-encoding"), bounds)
            if verdict.verdict is Verdict.ASK:
                verdict = self._streamed_ask(flow, exchange, dctx, decision, verdict, read)
            if verdict.allowed:
                _note(exchange, section, verdict, read, decision, dctx.decision_id)
                return body
            if self._refuse_now(flow, exchange, dctx, decision, section, verdict, read):
                raise ProtocolBodyRefused(str(verdict.reason))
            return body

        return hold

    def _tool_grants(
        self, flow: http.HTTPFlow, dctx: DecisionContext, verdict: BodyVerdict, body: ReadBody
    ) -> tuple[Grant, ...] | None:
        """The live tool grants that allow every asked call of an `ask` body, one per call, or
        None."""
        identity = dctx.identity
        if not isinstance(body, McpBody) or identity is None or dctx.host is None or dctx.port is None:
            return None
        tenant = self.ctx.policy.tenant(identity.tenant)
        path = read_target(flow.request.path).path
        where = Where(identity.tenant, identity.sandbox, dctx.host, dctx.port, flow.request.method, path)
        books = (tenant.grants if tenant is not None else EMPTY_GRANTS, self.ctx.grants)
        return granted(verdict, body, where, books, arguments_digest, time.time())

    async def _taken(self, grants: tuple[Grant, ...] | None) -> tuple[Grant, ...] | None:
        """The grants, once a use of each counted one is taken for its call (atomically, shared
        by workers and gateways); None when one has none left or its count is out of reach:
        the call is then asked about (a use already taken for another call stays spent)."""
        if grants is None or all(g.max_uses is None for g in grants):
            return grants
        uses = self.ctx.grants.uses
        if uses is None:
            return None
        for grant in grants:
            if grant.max_uses is not None and not await uses.take(grant):
                return None
        return grants

    def _streamed_ask(
        self,
        flow: http.HTTPFlow,
        exchange: Exchange,
        dctx: DecisionContext,
        decision: Decision,
        verdict: BodyVerdict,
        body: ReadBody,
    ) -> BodyVerdict:
        """An asked body decided in its stream: allowed by tool grants, else refused (nothing
        can wait for a person in there), saying how to be held; as it was in report mode."""
        grants = self._tool_grants(flow, dctx, verdict, body)
        # Nothing can wait for a shared count in here: a counted grant releases nothing.
        if grants is not None and any(g.max_uses is not None for g in grants):
            grants = None
        verdict = _released_by(exchange, verdict, grants)
        if verdict.verdict is Verdict.ASK and decision.mode is not Mode.REPORT:
            return refused_verdict(verdict, Reason.APPROVAL_REQUIRED, NEEDS_LENGTH)
        return verdict

    async def _hold(
        self,
        flow: http.HTTPFlow,
        exchange: Exchange,
        dctx: DecisionContext,
        decision: Decision,
        section: Section,
        verdict: BodyVerdict,
        body: ReadBody,
    ) -> None:
        """Hold an asked body for a person (Holds), then let its bytes go or refuse it."""
        holds = self._holds()
        state = self.ctx.connections.get(flow.client_conn.id)
        if holds is None or state is None or not isinstance(body, McpBody):
            refused = refused_verdict(verdict, Reason.APPROVAL_REQUIRED, NOT_HOLDABLE)
            await self._refuse(flow, exchange, dctx, decision, section, refused, body)
            return
        # The held request's own record says `ask`, with the body's facts (digests, no values).
        asking = replace(decision, allowed=False, ask=True, reason=Reason.APPROVAL_REQUIRED)
        calls = asked_calls(verdict, body, arguments_digest)
        facts = body_facts(section, verdict, body, report=False)
        ended, waited = await holds.hold(flow.client_conn, dctx, asking, state, calls=calls, facts=facts)
        if ended.approval is not None:
            approval: dict[str, object] = {"id": ended.approval[0], "by": ended.approval[1]}
            if waited.waited is not None:
                approval["waited_seconds"] = round(waited.waited, 3)
            exchange.extra["approval"] = approval
        if ended.allowed:
            _note(exchange, section, released_verdict(verdict), body, decision, dctx.decision_id)
            return
        refused = refused_verdict(verdict, ended.reason, ended.detail)
        await self._refuse(flow, exchange, dctx, decision, section, refused, body)

    def _holds(self) -> Holds | None:
        return self.holds

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
    names = _QUERY_GRAPHQL if isinstance(section, GraphqlSection) else _QUERY_RPC
    return any(any(name in key for name in names) for key in _query_keys(request.path))


def _query_keys(target: str) -> Iterator[str]:
    """Every key of the raw query string as a lenient server might read it: split on `&` and
    `;`, percent-decoded, case-folded, only letters and digits kept (`method[]`, `Method%00`,
    ` params` all name a call)."""
    query = target.partition("?")[2].partition("#")[0]
    for pair in re.split(r"[&;]", query):
        key = unquote_plus(pair.partition("=")[0], errors="replace").casefold()
        yield "".join(c for c in key if c.isalnum())


def _released_by(exchange: Exchange, verdict: BodyVerdict, grants: tuple[Grant, ...] | None) -> BodyVerdict:
    """An `ask` verdict allowed by the tool grants that cover every asked call (the record then
    names the first grant, as a granted request's does); as it was without them."""
    if grants is None:
        return verdict
    exchange.extra["approval"] = {"id": grants[0].id, "by": grants[0].by}
    return released_verdict(verdict, [g.rule_id for g in grants])


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
