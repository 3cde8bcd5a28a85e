"""How the gates answer a denial: the guest's refusal first, then the exchange's one record.

A refusal an approval could change says where to ask (sandgate.proxy.approvals.reserved); a
refused CONNECT also marks its connection refused (no upstream opens for it); a held request
the drain ended is answered and recorded as other cut requests are (503, `cut by shutdown`).
"""

from __future__ import annotations

from mitmproxy import http

from sandgate.policy.decision import Decision
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.exchange import CUT_BY_SHUTDOWN, Exchange
from sandgate.proxy.approvals.reserved import ReservedName
from sandgate.proxy.audit.records import DecisionContext
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.respond import SHUTTING_DOWN, decision_response, shutdown_response

__all__ = ["refuse_flow"]


async def refuse_flow(
    ctx: GatewayContext,
    flow: http.HTTPFlow,
    dctx: DecisionContext,
    decision: Decision,
    reserved: ReservedName | None,
) -> None:
    """Answer `flow` with the denial `decision` and record it (once, on its exchange)."""
    exchange = Exchange.of(flow)
    if decision.reason is Reason.INTERNAL_ERROR and decision.detail == SHUTTING_DOWN:
        # A held request the drain ended: answered and recorded as other cut requests are.
        response = shutdown_response(dctx.decision_id)
        await exchange.refuse(ctx.audit, flow, response, decision, dctx, status=503, error=CUT_BY_SHUTDOWN)
        return
    state = ctx.connections.get(flow.client_conn.id)
    if flow.request.method == "CONNECT" and state is not None:
        state.refused(decision.reason)
    ask = reserved.ask(dctx.host, dctx.port, dctx.method, dctx.path) if reserved is not None else None
    response = decision_response(decision, dctx.host, dctx.decision_id, ask=ask)
    await exchange.refuse(ctx.audit, flow, response, decision, dctx)
