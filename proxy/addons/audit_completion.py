"""Addon: finish the audit record of every request the request gate allowed, when it ends.

The request gate leaves an allowed request pending on its exchange (sandgate.proxy.addons.
exchange) with a place reserved in the audit queue; here, on `response` or `error`, that
becomes its one record: status, bytes each way, the credentials injected, and the failure when
the upstream failed after the policy allowed. An addon that refused the exchange itself (a
limit, a head cap, a placeholder) recorded the denial through the exchange: then nothing is
recorded here, so every decision has exactly one record.
After the request gate in the chain, and before the broker's `response` (its scrubbing changes
the body whose size the record counts).
"""

from __future__ import annotations

from dataclasses import replace

import structlog
from mitmproxy import http

from sandgate.policy.decision import Decision
from sandgate.proxy.addons.exchange import Exchange, Record
from sandgate.proxy.audit.records import DecisionContext, decision_record
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.mitm.wire_errors import Failure, failure_of_text

__all__ = ["AuditCompletion"]

log = structlog.get_logger("sandgate.audit_completion")


class AuditCompletion:
    """Writes the record of an allowed request once its response (or error) is known."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    async def response(self, flow: http.HTTPFlow) -> None:
        await self._complete(flow, _flagged(flow))

    async def error(self, flow: http.HTTPFlow) -> None:
        # Only a fixed category, never mitmproxy's message: it can quote wire bytes.
        await self._complete(flow, _flagged(flow) or failure_of_text(flow.error.msg if flow.error else ""))

    async def _complete(self, flow: http.HTTPFlow, failure: Failure | None) -> None:
        exchange = Exchange.of(flow)
        pending = exchange.pending
        if pending is None:
            return
        try:
            await exchange.complete(self.ctx.audit, lambda dctx, d: _record(flow, exchange, dctx, d, failure))
        except Exception:
            log.exception("hook_failed", hook="response", decision_id=pending[0].decision_id)


def _record(
    flow: http.HTTPFlow,
    exchange: Exchange,
    dctx: DecisionContext,
    decision: Decision,
    failure: Failure | None,
) -> Record:
    """The allowed exchange's one record, as it ended."""
    status = flow.response.status_code if flow.response else None
    if failure is not None and failure.reason is not None:
        # Allowed, then the upstream failed: the reason, and the status the guest got
        # (the upstream's when its head was already streamed to the guest).
        decision = replace(decision, reason=failure.reason)
        if flow.response is None or not flow.response.stream:
            status = failure.status
    streamed = exchange.streamed
    record = decision_record(
        dctx,
        decision,
        credentials=exchange.credentials,
        status=status,
        bytes_up=exchange.head_bytes + len(flow.request.raw_content or b"") + streamed.up,
        bytes_down=len(flow.response.raw_content or b"") + streamed.down if flow.response else None,
        error=failure.text if failure is not None else None,
    )
    if exchange.injectors:
        record["injectors"] = list(exchange.injectors)
    record.update(exchange.extra)
    return record


def _flagged(flow: http.HTTPFlow) -> Failure | None:
    """A failure another addon noted on the exchange (a fixed text, e.g. trailers refused)."""
    text = Exchange.of(flow).failure
    return Failure(str(text)) if text else None
