"""Holds: a CONNECT or request an `ask` rule matched, held open until an operator decides.

The tunnel gate and the request gate share one `Holds` (built once, with the pipeline): it holds
a decision in the pending store (`Approvals.hold`, then `wait`), writes the held request's own
record (decision `ask`, tied to its end's by `approval_id`), and remembers, per client
connection, what it holds (released when the client hangs up) and the tunnel an approval
opened (its requests are not asked about again). Approved, a held decision goes on exactly as
an allowed one; denied, timed out, over the sandbox's cap or cut by the drain, it is refused.
AgentProtocols holds MCP tool calls (`mcp.tools.ask`) through the same Holds, passing the
calls the operator is shown and the body's facts its `ask` record carries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import structlog
from mitmproxy import connection
from mitmproxy.connection import ConnectionState as WireState

from sandgate.policy.decision import Decision, Phase
from sandgate.policy.overrides import Decide
from sandgate.policy.reasons import Reason
from sandgate.proxy.approvals.store import AccessRequest, Approvals, QueueFull, State
from sandgate.proxy.approvals.tool_calls import ToolCall
from sandgate.proxy.audit.records import DecisionContext, decision_record, new_decision_id
from sandgate.proxy.context import ConnectionState, GatewayContext
from sandgate.proxy.respond import SHUTTING_DOWN

__all__ = ["Holds", "asks_released", "released"]

log = structlog.get_logger("sandgate.gate")

# An approval as records carry it: (the access request's id, who approved it).
Approval = tuple[str, str | None]


class Holds:
    """Decisions held for an operator, per client connection, and the tunnels approvals opened."""

    def __init__(self, ctx: GatewayContext, approvals: Approvals | None) -> None:
        self.ctx = ctx
        # None: `ask` decisions are refused (approval_required).
        self.approvals = approvals
        self._held: dict[str, set[AccessRequest]] = {}
        self._tunnels: dict[str, tuple[str, int, Approval]] = {}

    async def hold(
        self,
        client: connection.Client,
        dctx: DecisionContext,
        decision: Decision,
        state: ConnectionState,
        *,
        calls: tuple[ToolCall, ...] = (),
        facts: Mapping[str, object] | None = None,
    ) -> tuple[Decision, DecisionContext]:
        """Hold an `ask` decision until an operator decides: the decision to go on with (allowed,
        carrying the approval, when approved) or the denial to answer with, and the context
        with the time it waited. `calls`: the tool calls of a held MCP body (shown to the
        operator); `facts`: what the held request's record carries besides (its `mcp`)."""
        approvals, identity = self.approvals, dctx.identity
        # A transparent connection's HTTP requests are held like a proxied one's (identity is its
        # source address); its ClientHello is not: no CONNECT stands for it, and a client
        # waiting on a handshake times out long before an operator answers.
        if approvals is None or identity is None or (state.transparent and dctx.phase is not Phase.REQUEST):
            denial = decision.as_denial(Reason.APPROVAL_REQUIRED, "this request cannot be held for approval")
            return denial, dctx
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
                calls=calls,
            )
        except QueueFull:
            return decision.as_denial(Reason.APPROVAL_QUEUE_FULL, "too many requests held for approval"), dctx
        held = self._held.setdefault(client.id, set())
        intent = False
        try:
            failure, intent = await self._recorded(dctx, decision, request, facts)
            if failure is not None:
                return Decision.internal_error(self.ctx.policy.version, failure), dctx
            log.info("approval.held", id=request.id, sandbox=request.sandbox, host=request.host)
            held.add(request)
            # A client that hung up has its read side closed (mitmproxy sees the EOF at once).
            ended = await approvals.wait(request, lambda: not client.state & WireState.CAN_READ)
        except BaseException:
            if intent:
                # No end record follows a fault or a cancelled hook: the intent goes with it.
                self.ctx.audit.close_intent(dctx.decision_id)
            raise
        finally:
            held.discard(request)
            # A fault or a cancelled hook ends the hold undecided: never left open, never released.
            approvals.drop(request)
        outcome = self._journal_end(dctx, _ended(decision, request, ended), journaled=intent)
        return outcome, replace(dctx, waited=request.waited)

    def _journal_end(self, dctx: DecisionContext, outcome: Decision, *, journaled: bool) -> Decision:
        """The hold's `outcome` once its journal says so (`AuditLog.hold_ended`: a released
        body's reservation put back); a release whose reservation could not be journaled again
        is refused (fail closed, in any mode), still tied to its hold."""
        if not journaled or self.ctx.audit.hold_ended(dctx.decision_id, released=outcome.allowed):
            return outcome
        failed = Decision.internal_error(self.ctx.policy.version, "audit journal failed")
        return replace(failed, rule_id=outcome.rule_id, approval=outcome.approval)

    async def _recorded(
        self,
        dctx: DecisionContext,
        decision: Decision,
        request: AccessRequest,
        facts: Mapping[str, object] | None,
    ) -> tuple[str | None, bool]:
        """The held request's own record (decision `ask`, tied to its end's by `approval_id`),
        then its end journaled should this process die before that record is written (the trail
        would have the `ask` alone): an intent under the end record's id, so writing that record
        closes it (an allowed end's reservation takes its place). A held MCP body's exchange is
        reserved already: the end stands in for that reservation while held (nothing went
        upstream), which is put back if released (`AuditLog.hold_ended`). (What could not be
        written, whether an intent was journaled.)"""
        record = decision_record(replace(dctx, decision_id=new_decision_id()), decision)
        record.update(facts or {})
        record["decision"] = "ask"
        record["approval_id"] = request.id
        if not await self.ctx.audit.emit(record):
            return "audit queue full", False
        intent = self.ctx.audit.intend(_cut_record(dctx, decision, request))
        if intent is False:
            return "audit journal failed", False
        return None, bool(intent)

    def approved_tunnel(self, client: connection.Client, host: str, port: int, decision: Decision) -> None:
        """A held CONNECT was approved: the tunnel's requests are not asked about again."""
        if decision.approval is not None and decision.allowed:
            self._tunnels[client.id] = (host, port, decision.approval)

    def tunnel_approval(self, client: connection.Client, host: str, port: int) -> Approval | None:
        """The approval that opened this client's tunnel to host:port, or None."""
        tunnel = self._tunnels.get(client.id)
        return tunnel[2] if tunnel is not None and tunnel[:2] == (host, port) else None

    def client_gone(self, client: connection.Client) -> None:
        """The client hung up: what it has held ends (an operator can no longer release it)."""
        self._tunnels.pop(client.id, None)
        held = self._held.pop(client.id, None)
        if held and self.approvals is not None:
            for request in list(held):
                self.approvals.client_gone(request)


def _cut_record(dctx: DecisionContext, decision: Decision, request: AccessRequest) -> dict[str, Any]:
    """The held request's end as the trail has it should the process holding it die: refused
    (nothing went upstream); the journal's reader adds `error: cut by worker exit`."""
    cut = decision.as_denial(Reason.INTERNAL_ERROR, "the gateway process holding it exited")
    # Not counted in the metrics: it is written only if the process dies (its end is counted).
    return decision_record(dctx, replace(cut, approval=(request.id, None)), count=False)


def _ended(decision: Decision, request: AccessRequest, ended: State) -> Decision:
    """The held decision as its hold ended."""
    approval = (request.id, request.by)
    if ended is State.APPROVED:
        return released(decision, approval)
    if ended is State.CUT:
        return replace(decision.as_denial(Reason.INTERNAL_ERROR, SHUTTING_DOWN), approval=approval)
    reason, detail = {
        State.DENIED: (Reason.APPROVAL_DENIED, "an operator denied this request"),
        State.EXPIRED: (Reason.APPROVAL_TIMEOUT, "no decision in time"),
    }.get(ended, (Reason.APPROVAL_REQUIRED, "the client hung up while the request was held"))
    return replace(decision.as_denial(reason, detail), approval=approval)


def released(decision: Decision, approval: Approval) -> Decision:
    """An `ask` decision an operator approved: allowed, as it would have been by a rule."""
    return replace(decision, allowed=True, ask=False, reason=Reason.ALLOWED, approval=approval)


def asks_released(decide: Decide, approval: Approval) -> Decide:
    """`decide` inside a tunnel an operator approved: what it would ask about is allowed."""

    async def in_approved_tunnel(*args: Any, **kwargs: Any) -> Decision:
        decision = await decide(*args, **kwargs)
        return released(decision, approval) if decision.ask else decision

    return in_approved_tunnel
