"""Addon: the head caps' options for the HTTP/1 layer (sandgate.proxy.mitm.head_caps), and their audit.

- A refused request head (431 over a cap, 408 past the read timeout, or a close for
  pipelined bytes over the cap) has no flow: the layer reports it through the
  `sandgate_head_refused` hook and this addon writes its one record, with what the
  connection has established (listener, client, sandbox, tunnel destination).
- A response head over the cap reaches the flow as a `RefusedResponse`: this addon gives it
  the request's decision id and records the request as denied with `header_too_large`
  (the upstream connection is already closed; `Connection: close` closes the guest's).
Must come before Gate in the chain, so the refused response is recorded once, here.
"""

from __future__ import annotations

from typing import Any

import structlog
from mitmproxy import http

from sandgate.policy.decision import Decision, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.flow_keys import HEAD_BYTES_KEY, PENDING_KEY
from sandgate.proxy.addons.refusal import refuse
from sandgate.proxy.audit.records import decision_record
from sandgate.proxy.config import HeadsConfig
from sandgate.proxy.context import GatewayContext, decision_context
from sandgate.proxy.mitm.head_caps import (
    OPT_MAX_BYTES,
    OPT_MAX_LINES,
    OPT_TIMEOUT,
    HeadRefusal,
    RefusedResponse,
    refused_response,
)

__all__ = ["HeadGuard"]

log = structlog.get_logger("sandgate.heads")


class HeadGuard:
    """Declares the head caps (mitmproxy options read by the HTTP/1 layer) and audits refusals."""

    def __init__(self, ctx: GatewayContext, config: HeadsConfig) -> None:
        self.ctx = ctx
        self.config = config

    def load(self, loader: Any) -> None:
        cfg = self.config
        loader.add_option(OPT_MAX_BYTES, int, cfg.max_bytes, "Largest HTTP/1 head, in bytes.")
        loader.add_option(OPT_MAX_LINES, int, cfg.max_lines, "Most lines in one HTTP/1 head.")
        loader.add_option(OPT_TIMEOUT, float, cfg.read_timeout_seconds, "Seconds to read one request head.")

    async def sandgate_head_refused(self, refusal: HeadRefusal) -> None:
        # Read the connection's state first: its close is already under way.
        state = self.ctx.connections.get(refusal.client.id)
        try:
            dctx = decision_context(state, Phase.REQUEST, refusal.client.proxy_mode.full_spec)
            dctx.sni, dctx.decision_id = state.sni if state else None, refusal.decision_id
            decision = Decision(
                reason=refusal.reason, policy_version=self.ctx.policy.version, detail=refusal.detail
            )
            await self.ctx.audit.emit(decision_record(dctx, decision, status=refusal.status))
        except Exception:
            log.exception("hook_failed", hook="sandgate_head_refused")

    async def response(self, flow: http.HTTPFlow) -> None:
        if not isinstance(flow.response, RefusedResponse):
            return
        try:
            limit = flow.response.limit
            pending = flow.metadata.pop(PENDING_KEY, None)
            if pending is None:
                # Not decided by the gate (cannot happen for an upstream answer): still refused.
                flow.response = refused_response(502, Reason.HEADER_TOO_LARGE, None, limit)
                return
            dctx, allowed = pending
            cfg = self.config
            cap = f"{cfg.max_lines} lines" if limit == "max_lines" else f"{cfg.max_bytes} bytes"
            detail = f"response head over {cap}"
            decision = allowed.as_denial(Reason.HEADER_TOO_LARGE, detail)
            response = refused_response(502, Reason.HEADER_TOO_LARGE, dctx.decision_id, limit)
            bytes_up = flow.metadata.get(HEAD_BYTES_KEY, 0) + len(flow.request.raw_content or b"")
            await refuse(self.ctx.audit, flow, response, dctx, decision, status=502, bytes_up=bytes_up)
        except Exception:
            log.exception("hook_failed", hook="response")
            flow.response = refused_response(502, Reason.HEADER_TOO_LARGE, None, "max_bytes")
