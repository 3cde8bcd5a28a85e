"""Addon: a protocol switch (`Upgrade`, `101 Switching Protocols`) never opens an unchecked pipe.

After a 101 mitmproxy relays the connection as WebSocket messages, or else as raw bytes
that no rule, limit, placeholder check or scrubber sees. So:

- Requests: `Upgrade: h2c` (HTTP/2 over cleartext, an offer a server may ignore, RFC 7540
  3.2) is stripped with `HTTP2-Settings`: the request goes on as HTTP/1.1 and every later
  one is decided as usual. Any other `Upgrade` is decided by the policy (the request gate puts it in
  `EgressRequest.upgrade`): `websocket` passes only on an allow rule with `websocket: true`;
  everything else is `upgrade_not_allowed` (403).
- Responses: a 101 the gateway did not approve (not the WebSocket handshake of a request the
  policy allowed, or one mitmproxy would not parse as WebSocket) is answered 403
  `upgrade_not_allowed` instead, and both sides are closed at once.
- WebSocket messages and control frames (PING and PONG payloads, CLOSE reasons) from the
  guest: each is checked for placeholders before it is forwarded (none ever is) and counted
  against the tenant's egress limit. A refusal ends the session cleanly: the guest gets a
  CLOSE with 1008 (1013 for a limit, 1011 for a fault) naming the reason code and the
  record, the upstream 1001; one `deny` record with the broker's reason. What the upstream
  sends is scrubbed by the broker addon. On a rule with `mcp:` or `jsonrpc:` each message
  that passed is then decided by AgentWebsocket (sandgate.proxy.addons.agent_websocket),
  which ends a session through `end_session` too.
- The cap on one message (`websocket.max_message_bytes`, the option the WebSocket layer
  reads: sandgate.proxy.mitm.websocket_guard) is declared here; the layer closes a session
  whose message passes it, and this addon writes its one `message_too_large` record.
Every hook is guarded: a fault denies (and closes) with `internal_error`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import structlog
import wsproto.handshake
from mitmproxy import ctx as mitmproxy_ctx
from mitmproxy import http
from wsproto.frame_protocol import CloseReason

from sandgate.brokers import RequestBodyGuard
from sandgate.brokers.outcome import DenialCause
from sandgate.policy.decision import Decision, Phase
from sandgate.policy.reasons import Reason
from sandgate.policy.upgrade import WEBSOCKET, requested_upgrade
from sandgate.proxy.addons.credential_broker import broker_request
from sandgate.proxy.addons.exchange import Exchange, exchange_context
from sandgate.proxy.addons.tunnel_rules import tenant_limits
from sandgate.proxy.audit.records import DecisionContext, decision_record, new_decision_id
from sandgate.proxy.audit.trail import AuditLog
from sandgate.proxy.config import WebSocketConfig
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.mitm.closer import ConnectionCloser
from sandgate.proxy.mitm.websocket_guard import (
    OPT_MAX_MESSAGE,
    OversizedMessage,
    SessionClose,
    WebSocketControl,
    close_reason,
    request_close,
)
from sandgate.proxy.respond import denied_response

__all__ = ["Upgrades", "WebSocketSession", "end_session", "strip_h2c"]

log = structlog.get_logger("sandgate.upgrades")

# What the guest's CLOSE says a refusal was (RFC 6455 7.4.1; 1013 is IANA's "Try Again Later").
_GUEST_CODES = {
    Reason.RATE_LIMITED: CloseReason.TRY_AGAIN_LATER,
    Reason.INTERNAL_ERROR: CloseReason.INTERNAL_ERROR,
}
# How a record's detail names what carried a placeholder.
_CONTROL_NAMES = {"ping": "ping", "pong": "pong", "close": "close reason"}


@dataclass(slots=True)
class WebSocketSession:
    """An approved WebSocket: the handshake's decision and the guard its guest messages pass."""

    dctx: DecisionContext
    decision: Decision
    guard: RequestBodyGuard | None
    closed: bool = False


class Upgrades:
    """Strips h2c offers, closes unapproved 101s, checks WebSocket messages and control frames
    from the guest, and declares (and records) the cap on one WebSocket message."""

    def __init__(
        self, ctx: GatewayContext, closer: ConnectionCloser, config: WebSocketConfig | None = None
    ) -> None:
        self.ctx = ctx
        self.closer = closer
        self.config = config or WebSocketConfig()

    def load(self, loader: Any) -> None:
        loader.add_option(
            OPT_MAX_MESSAGE,
            int,
            self.config.max_message_bytes,
            "Largest WebSocket message (all fragments, inflated), in bytes; a larger one closes the session.",
        )

    # -- requests (before the request gate decides) --------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.error is not None:
            return
        try:
            strip_h2c(flow.request.headers)
        except Exception:
            log.exception("hook_failed", hook="upgrades.requestheaders")
            flow.response = denied_response(Reason.INTERNAL_ERROR, None, "-")

    # -- responses ---------------------------------------------------------------------------

    async def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None or response.status_code != 101:
            return
        exchange = Exchange.of(flow)
        pending = exchange.pending
        try:
            if pending is not None and _websocket_handshake(flow):
                dctx, decision = pending
                exchange.websocket = WebSocketSession(dctx, decision, self._guard(flow, dctx))
                return
        except Exception:
            log.exception("hook_failed", hook="upgrades.responseheaders")
        await self._refuse_switch(flow, exchange)

    async def _refuse_switch(self, flow: http.HTTPFlow, exchange: Exchange) -> None:
        """Answer 403 instead of an unapproved 101, close the upstream now and the guest after."""
        pending = exchange.pending
        if pending is not None:
            dctx, allowed = pending
        else:
            dctx, allowed = self._undecided(flow), Decision(policy_version=self.ctx.policy.version)
        # Set now (no hook or layer may take the 101 for approved) and again in `response`:
        # mitmproxy fills the message it holds with the (empty) body of the 101 it read.
        exchange.switch_refused = (dctx.host, dctx.decision_id)
        response = _refusal(flow, dctx.host, dctx.decision_id)
        flow.response = response  # before the close: the 101 is never what the flow holds
        self.closer.close(flow.client_conn, flow.server_conn, keep_client=True)
        denial = allowed.as_denial(
            Reason.UPGRADE_NOT_ALLOWED, "the upstream switched protocols without the gateway's approval"
        )
        try:
            await exchange.refuse(self.ctx.audit, flow, response, denial, dctx, status=403)
        except Exception:
            log.exception("hook_failed", hook="upgrades.record")

    def _undecided(self, flow: http.HTTPFlow) -> DecisionContext:
        """A record's context for a flow the request gate left no decision on."""
        state = self.ctx.connections.get(flow.client_conn.id)
        dctx = exchange_context(state, flow.client_conn, Phase.REQUEST, flow=flow)
        return replace(
            dctx, host=flow.request.pretty_host, port=None, identity=state.identity if state else None
        )

    def response(self, flow: http.HTTPFlow) -> None:
        exchange = Exchange.of(flow)
        refused, exchange.switch_refused = exchange.switch_refused, None
        if refused is not None:
            flow.response = _refusal(flow, *refused)

    def _guard(self, flow: http.HTTPFlow, dctx: DecisionContext) -> RequestBodyGuard | None:
        broker, identity = self.ctx.broker, dctx.identity
        if broker is None or identity is None:
            return None
        return broker.message_guard(identity.tenant, identity.sandbox, broker_request(flow, dctx, None))

    # -- WebSocket messages ------------------------------------------------------------------

    async def websocket_message(self, flow: http.HTTPFlow) -> None:
        session = Exchange.of(flow).websocket
        if flow.websocket is None or not flow.websocket.messages:
            return
        messages = flow.websocket.messages
        # mitmproxy keeps every message of a session on its flow: a guest streaming for hours
        # would grow the gateway without bound. The ones before this were relayed already, and
        # no addon reads back further than the newest (this hook runs first).
        del messages[:-1]
        message = messages[-1]
        if message.from_client and await self._refused(flow, session, message.content, "message"):
            message.drop()

    async def sandgate_websocket_control(self, control: WebSocketControl) -> None:
        """A PING, PONG or CLOSE from the guest passes the checks its messages pass (the
        upstream's are scrubbed by the broker addon)."""
        if control.from_client:
            session = Exchange.of(control.flow).websocket
            await self._refused(control.flow, session, control.payload, _CONTROL_NAMES[control.kind])

    async def sandgate_websocket_oversize(self, oversized: OversizedMessage) -> None:
        """The layer closed a session for a message over the cap: its one record."""
        flow = oversized.flow
        try:
            side = "guest" if oversized.from_client else "upstream"
            detail = f"a WebSocket message from the {side} over {oversized.limit} bytes"
            session = Exchange.of(flow).websocket
            if isinstance(session, WebSocketSession):
                session.closed = True
                dctx, base = session.dctx, session.decision
            else:  # no WebSocket is relayed unapproved: recorded all the same
                dctx, base = self._undecided(flow), Decision(policy_version=self.ctx.policy.version)
            dctx = replace(dctx, decision_id=oversized.decision_id)
            await self.ctx.audit.emit(decision_record(dctx, base.as_denial(Reason.MESSAGE_TOO_LARGE, detail)))
        except Exception:
            log.exception("hook_failed", hook="upgrades.sandgate_websocket_oversize")

    async def _refused(self, flow: http.HTTPFlow, session: object, content: bytes, what: str) -> bool:
        """Check one guest message or control frame (`what`); True: refused, the session ends."""
        if not isinstance(session, WebSocketSession) or session.closed:
            self._close_unapproved(flow)  # a WebSocket the gateway did not approve, or one refused
            return True
        denial = self._checked(session, content, what)
        if denial is None:
            return False
        await self._refuse(flow, session, denial)
        return True

    def _checked(self, session: WebSocketSession, content: bytes, what: str) -> Decision | None:
        """`_check_message`, with a fault turned into an `internal_error` denial."""
        try:
            return self._check_message(session, content, what)
        except Exception:
            log.exception("hook_failed", hook="upgrades.websocket", what=what)
            base = session.decision
            return Decision.internal_error(base.policy_version, address=base.address)

    def _check_message(self, session: WebSocketSession, content: bytes, what: str) -> Decision | None:
        """The denial for one guest message or control frame (`what`: a placeholder, a limit),
        or None to forward it."""
        base = session.decision
        if session.guard is not None:
            # One guard for the session: a placeholder split over messages and frames is found too.
            found = session.guard.feed(content)
            if found is not None:
                # A placeholder is never replaced inside a message: wherever it is, it is misplaced.
                reason = (
                    Reason.CREDENTIAL_HOST_MISMATCH
                    if found.cause is DenialCause.BODY_TOO_LARGE
                    else found.reason
                )
                return base.as_denial(reason, f"a placeholder in a WebSocket {what}")
        identity = session.dctx.identity
        limits = tenant_limits(self.ctx.policy, identity)
        if identity is not None and limits is not None:
            exceeded = self.ctx.limiter.add_egress(identity.tenant, identity.sandbox, limits, len(content))
            if exceeded is not None:
                counted = "messages" if what == "message" else f"{what}s"
                return base.as_denial(exceeded.reason, f"{exceeded.limit} (WebSocket {counted})")
        return None

    async def _refuse(self, flow: http.HTTPFlow, session: WebSocketSession, denial: Decision) -> None:
        await end_session(self.ctx.audit, self.closer, flow, session, denial)

    def _close_unapproved(self, flow: http.HTTPFlow) -> None:
        """A WebSocket the gateway did not approve, or one already refused: closed, unrecorded."""
        text = f"sandgate: {Reason.UPGRADE_NOT_ALLOWED.value}"
        if not request_close(flow, SessionClose(CloseReason.POLICY_VIOLATION, text, CloseReason.GOING_AWAY)):
            self.closer.close(flow.client_conn, flow.server_conn)


async def end_session(
    audit: AuditLog,
    closer: ConnectionCloser,
    flow: http.HTTPFlow,
    session: WebSocketSession,
    denial: Decision,
    extra: Mapping[str, object] | None = None,
) -> None:
    """End the session cleanly (the guest reads why in its CLOSE), then record the denial
    (with `extra` fields); later messages of the session are refused unrecorded."""
    session.closed = True
    dctx = replace(session.dctx, decision_id=new_decision_id())
    code = _GUEST_CODES.get(denial.reason, CloseReason.POLICY_VIOLATION)
    close = SessionClose(code, close_reason(denial.reason, dctx.decision_id), CloseReason.GOING_AWAY)
    if not request_close(flow, close):
        closer.close(flow.client_conn, flow.server_conn)
    # Refused first, recorded second: a fault while recording leaves the session closing.
    try:
        record = decision_record(dctx, denial)
        record.update(extra or {})
        await audit.emit(record)
    except Exception:
        log.exception("hook_failed", hook="upgrades.record")


def _refusal(flow: http.HTTPFlow, host: str | None, decision_id: str) -> http.Response:
    """403 `upgrade_not_allowed`; an HTTP/1 guest's connection closes after it."""
    response = denied_response(Reason.UPGRADE_NOT_ALLOWED, host, decision_id)
    if flow.request.http_version.startswith("HTTP/1"):
        response.headers["Connection"] = "close"
    return response


def strip_h2c(headers: http.Headers) -> bool:
    """Drop an `Upgrade: h2c` offer (and its `HTTP2-Settings`); True when there was one.

    Only an offer of h2c alone is stripped; a list with other protocols stays for the policy
    to refuse. The `Connection` tokens naming the stripped headers go too.
    """
    if requested_upgrade(headers.items(multi=True)) != "h2c":
        return False
    for name in ("upgrade", "http2-settings"):
        headers.pop(name, None)
    tokens = [
        t.strip()
        for value in headers.get_all("connection")
        for t in value.split(",")
        if t.strip() and t.strip().lower() not in ("upgrade", "http2-settings")
    ]
    headers.pop("connection", None)
    if tokens:
        headers["Connection"] = ", ".join(tokens)
    return True


def _websocket_handshake(flow: http.HTTPFlow) -> bool:
    """Whether mitmproxy will relay this 101 as WebSocket messages (its own test, restated)
    for a request that asked for exactly that."""
    assert flow.response is not None
    request = flow.request
    return (
        bool(mitmproxy_ctx.options.websocket)
        and requested_upgrade(request.headers.items(multi=True)) == WEBSOCKET
        and flow.response.headers.get("upgrade", "").lower() == WEBSOCKET
        and request.headers.get("Sec-WebSocket-Version", "").encode() == wsproto.handshake.WEBSOCKET_VERSION
    )
