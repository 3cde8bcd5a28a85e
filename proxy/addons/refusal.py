"""Refuse first, record second: how an addon answers a guest's request with a denial.

The answer goes on the flow before the record is attempted, so a fault while recording (a
full audit queue, a crash) never leaves the request going upstream; the record follows.
"""

from __future__ import annotations

from mitmproxy import http

from sandgate.policy.decision import Decision
from sandgate.proxy.audit.records import DecisionContext, decision_record
from sandgate.proxy.audit.trail import AuditLog

__all__ = ["refuse", "refuse_now"]


async def refuse(
    audit: AuditLog,
    flow: http.HTTPFlow,
    response: http.Response,
    dctx: DecisionContext,
    decision: Decision,
    *,
    status: int | None = None,
    bytes_up: int | None = None,
) -> bool:
    """Answer `flow` with `response`, then write the denial's one record; whether it was queued."""
    flow.response = response
    return await audit.emit(decision_record(dctx, decision, status=status, bytes_up=bytes_up))


def refuse_now(
    audit: AuditLog, flow: http.HTTPFlow, response: http.Response, dctx: DecisionContext, decision: Decision
) -> None:
    """`refuse` from synchronous code (a body stream): the record is queued without waiting."""
    flow.response = response
    audit.emit_nowait(decision_record(dctx, decision))
