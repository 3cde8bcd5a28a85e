"""Addon: finish the audit record of every request the Gate allowed, when its exchange ends.

The Gate leaves an allowed request's (context, decision) on the flow (`PENDING_KEY`) with a
place reserved in the audit queue; here, on `response` or `error`, that becomes its one
record: status, bytes each way, the credentials injected, and the failure when the upstream
failed after the policy allowed. An addon that refused the exchange itself (a limit, a
head cap, a placeholder) takes the pending decision off the flow and records the denial:
then nothing is recorded here, so every decision has exactly one record.
After the Gate in the chain, and before the broker's `response` (its scrubbing changes the
body whose size the record counts).
"""

from __future__ import annotations

from dataclasses import replace

import structlog
from mitmproxy import http

from sandgate.proxy.addons.flow_keys import (
    CREDENTIALS_KEY,
    FAILURE_KEY,
    HEAD_BYTES_KEY,
    PENDING_KEY,
    STREAMED_BYTES_KEY,
    StreamedBytes,
)
from sandgate.proxy.audit.records import decision_record
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
        pending = flow.metadata.pop(PENDING_KEY, None)
        if pending is None:
            return
        dctx, decision = pending
        credentials, injectors = flow.metadata.get(CREDENTIALS_KEY, ((), ()))
        streamed = flow.metadata.get(STREAMED_BYTES_KEY) or StreamedBytes()
        try:
            status = flow.response.status_code if flow.response else None
            if failure is not None and failure.reason is not None:
                # Allowed, then the upstream failed: the reason, and the status the guest got
                # (the upstream's when its head was already streamed to the guest).
                decision = replace(decision, reason=failure.reason)
                if flow.response is None or not flow.response.stream:
                    status = failure.status
            record = decision_record(
                dctx,
                decision,
                credentials=credentials,
                status=status,
                bytes_up=flow.metadata.get(HEAD_BYTES_KEY, 0)
                + len(flow.request.raw_content or b"")
                + streamed.up,
                bytes_down=len(flow.response.raw_content or b"") + streamed.down if flow.response else None,
                error=failure.text if failure is not None else None,
            )
            if injectors:
                record["injectors"] = list(injectors)
            await self.ctx.audit.emit(record)
        except Exception:
            log.exception("hook_failed", hook="response", decision_id=dctx.decision_id)


def _flagged(flow: http.HTTPFlow) -> Failure | None:
    """A failure another addon noted on the flow (a fixed text, e.g. trailers refused)."""
    text = flow.metadata.get(FAILURE_KEY)
    return Failure(str(text)) if text else None
