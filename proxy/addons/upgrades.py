"""Addon: a protocol switch (`Upgrade`, `101 Switching Protocols`) never opens an unchecked pipe.

After a 101 mitmproxy relays the connection as WebSocket messages, or else as raw bytes
that no rule, limit, placeholder check or scrubber sees. So:

- Requests: `Upgrade: h2c` (HTTP/2 over cleartext, an offer a server may ignore, RFC 7540
  3.2) is stripped with `HTTP2-Settings`: the request goes on as HTTP/1.1 and every later
  one is decided as usual. Any other `Upgrade` is decided by the policy (the Gate puts it in
  `EgressRequest.upgrade`): `websocket` passes only on an allow rule with `websocket: true`;
  everything else is `upgrade_not_allowed` (403).
- Responses: a 101 the gateway did not approve (not the WebSocket handshake of a request the
  policy allowed, or one mitmproxy would not parse as WebSocket) is answered 403
  `upgrade_not_allowed` instead, and both sides are closed at once.
- WebSocket messages from the guest: each is checked for placeholders before it is
  forwarded (none ever is: the session is closed, with the broker's reason) and counted
  against the tenant's egress limit. Server messages are scrubbed by the broker addon.
Every hook is guarded: a fault denies (and closes) with `internal_error`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import structlog
import wsproto.handshake
from mitmproxy import ctx as mitmproxy_ctx
from mitmproxy import http

from sandgate.brokers import RequestBodyGuard
from sandgate.brokers.outcome import DenialCause
from sandgate.policy.decision import Decision, Phase
from sandgate.policy.reasons import Reason
from sandgate.policy.upgrade import WEBSOCKET, requested_upgrade
from sandgate.proxy.addons.credentials import broker_request
from sandgate.proxy.addons.flow_keys import PENDING_KEY
from sandgate.proxy.addons.limits import tenant_limits
from sandgate.proxy.addons.refusal import refuse
from sandgate.proxy.audit.records import DecisionContext, decision_record, new_decision_id
from sandgate.proxy.context import GatewayContext, decision_context
from sandgate.proxy.mitm.closer import ConnectionCloser
from sandgate.proxy.respond import denied_response

__all__ = ["Upgrades", "strip_h2c"]

log = structlog.get_logger("sandgate.upgrades")

_SESSION_KEY = "sandgate.websocket.session"
_REFUSED_KEY = "sandgate.upgrade.refused"


@dataclass(slots=True)
class _Session:
    """An approved WebSocket: the handshake's decision and the guard its guest messages pass."""

    dctx: DecisionContext
    decision: Decision
    guard: RequestBodyGuard | None
    closed: bool = False


class Upgrades:
    """Strips h2c offers, closes unapproved 101s, and checks WebSocket messages from the guest."""

    def __init__(self, ctx: GatewayContext, closer: ConnectionCloser) -> None:
        self.ctx = ctx
        self.closer = closer

    # -- requests (before the Gate decides) --------------------------------------------------

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
        pending = flow.metadata.get(PENDING_KEY)
        try:
            if pending is not None and _websocket_handshake(flow):
                dctx, decision = pending
                flow.metadata[_SESSION_KEY] = _Session(dctx, decision, self._guard(flow, dctx))
                return
        except Exception:
            log.exception("hook_failed", hook="upgrades.responseheaders")
        await self._refuse_switch(flow)

    async def _refuse_switch(self, flow: http.HTTPFlow) -> None:
        """Answer 403 instead of an unapproved 101, close the upstream now and the guest after."""
        pending = flow.metadata.pop(PENDING_KEY, None)
        if pending is not None:
            dctx, allowed = pending
        else:
            dctx = decision_context(self.ctx.connections.get(flow.client_conn.id), Phase.REQUEST)
            dctx.host, dctx.port = flow.request.pretty_host, None
            dctx.method, dctx.path = flow.request.method, flow.request.path
            allowed = Decision(policy_version=self.ctx.policy.version)
        # Set now (no hook or layer may take the 101 for approved) and again in `response`:
        # mitmproxy fills the message it holds with the (empty) body of the 101 it read.
        flow.metadata[_REFUSED_KEY] = (dctx.host, dctx.decision_id)
        response = _refusal(flow, dctx.host, dctx.decision_id)
        flow.response = response  # before the close: the 101 is never what the flow holds
        self.closer.close(flow.client_conn, flow.server_conn, keep_client=True)
        denial = allowed.as_denial(
            Reason.UPGRADE_NOT_ALLOWED, "the upstream switched protocols without the gateway's approval"
        )
        try:
            await refuse(self.ctx.audit, flow, response, dctx, denial, status=403)
        except Exception:
            log.exception("hook_failed", hook="upgrades.record")

    def response(self, flow: http.HTTPFlow) -> None:
        refused = flow.metadata.pop(_REFUSED_KEY, None)
        if refused is not None:
            flow.response = _refusal(flow, *refused)

    def _guard(self, flow: http.HTTPFlow, dctx: DecisionContext) -> RequestBodyGuard | None:
        broker, identity = self.ctx.broker, dctx.identity
        if broker is None or identity is None:
            return None
        return broker.message_guard(identity.tenant, identity.sandbox, broker_request(flow, dctx, None))

    # -- WebSocket messages ------------------------------------------------------------------

    async def websocket_message(self, flow: http.HTTPFlow) -> None:
        session = flow.metadata.get(_SESSION_KEY)
        if flow.websocket is None or not flow.websocket.messages:
            return
        messages = flow.websocket.messages
        # mitmproxy keeps every message of a session on its flow: a guest streaming for hours
        # would grow the gateway without bound. The ones before this were relayed already, and
        # no addon reads back further than the newest (this hook runs first).
        del messages[:-1]
        message = messages[-1]
        if not message.from_client:
            return
        if not isinstance(session, _Session) or session.closed:
            message.drop()  # a WebSocket the gateway did not approve, or one already refused
            self.closer.close(flow.client_conn, flow.server_conn)
            return
        try:
            denial = self._check_message(session, message.content)
        except Exception:
            log.exception("hook_failed", hook="upgrades.websocket_message")
            base = session.decision
            denial = Decision(
                reason=Reason.INTERNAL_ERROR, policy_version=base.policy_version, address=base.address
            )
        if denial is None:
            return
        message.drop()
        session.closed = True
        self.closer.close(flow.client_conn, flow.server_conn)
        dctx = replace(session.dctx, decision_id=new_decision_id())
        try:
            await self.ctx.audit.emit(decision_record(dctx, denial))
        except Exception:
            log.exception("hook_failed", hook="upgrades.record")

    def _check_message(self, session: _Session, content: bytes) -> Decision | None:
        """The denial for one guest message (a placeholder, a limit), or None to forward it."""
        base = session.decision
        if session.guard is not None:
            found = session.guard.feed(content)
            if found is not None:
                # A placeholder is never replaced inside a message: wherever it is, it is misplaced.
                reason = (
                    Reason.CREDENTIAL_HOST_MISMATCH
                    if found.cause is DenialCause.BODY_TOO_LARGE
                    else found.reason
                )
                return base.as_denial(reason, "a placeholder in a WebSocket message")
        identity = session.dctx.identity
        limits = tenant_limits(self.ctx.policy, identity)
        if identity is not None and limits is not None:
            exceeded = self.ctx.limiter.add_egress(identity.tenant, identity.sandbox, limits, len(content))
            if exceeded is not None:
                return base.as_denial(exceeded.reason, f"{exceeded.limit} (WebSocket messages)")
        return None


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
