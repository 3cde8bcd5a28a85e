"""Addon: credential brokering on requests the policy allowed, scrubbing on their responses.

The guest holds placeholders. On an allowed, intercepted (or plain HTTP) request the broker
swaps a placeholder for the real credential where the credential is bound (host, port,
scheme, method, path), replaces any guest-supplied copy of the header it manages, and denies
(`credential_host_mismatch`) a placeholder seen anywhere else, its own or another sandbox's;
the placeholder is never forwarded. Responses are scrubbed: a real secret value coming back
(echo endpoints, error messages) is replaced by its placeholder before the guest sees it;
when a response (or a WebSocket session) that had such replacements ends, one `finding`
record (`kind: secret_scrubbed`: the credentials' names and how many, never a value) goes to
the audit trail, tied to the exchange's record by `of`.
Every hook is guarded: a fault denies with `internal_error`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import structlog
from mitmproxy import http
from wsproto.frame_protocol import CloseReason

from sandgate.brokers import (
    BrokerAllow,
    BrokerDenial,
    BrokerRequest,
    apply_mutations,
)
from sandgate.brokers.decoding import stream_decoder
from sandgate.brokers.scrub import Tally
from sandgate.policy.decision import Decision
from sandgate.policy.protocols.decide import BodyVerdict, MessageVerdict, Verdict
from sandgate.policy.protocols.jsonrpc import RpcBody
from sandgate.policy.protocols.mcp import McpBody
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.exchange import Exchange, Scrubbed
from sandgate.proxy.addons.limits import body_length_unknown, declared_length
from sandgate.proxy.addons.protocol_bodies import Section, refusal_response
from sandgate.proxy.audit.records import DecisionContext, secret_scrubbed_record
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.metrics import METRICS
from sandgate.proxy.mitm.websocket_guard import (
    CONTROL_PAYLOAD_MAX,
    SessionClose,
    WebSocketControl,
    request_close,
)
from sandgate.proxy.respond import denied_response

__all__ = ["CredentialBroker", "StreamDenied", "broker_request", "chained"]

log = structlog.get_logger("sandgate.broker")

# Request bodies up to this size are read whole and scanned; larger ones stream past the guard.
MAX_BUFFERED_BODY = 1024 * 1024


class StreamDenied(Exception):
    """Raised from a request body stream to abort it: a placeholder was found on its way."""


class CredentialBroker:
    """Applies the broker to allowed requests and scrubs their responses."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    # -- requests ----------------------------------------------------------------------------

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        exchange = Exchange.of(flow)
        if flow.response is not None or flow.error is not None or exchange.pending is None:
            return
        if _request_streamed(flow.request):
            # Too large (or of unknown size) to buffer: plan now, guard every chunk on its way.
            await self._broker(flow, exchange, body=None)

    async def request(self, flow: http.HTTPFlow) -> None:
        exchange = Exchange.of(flow)
        pending = exchange.pending
        if flow.response is not None or flow.error is not None or pending is None:
            return
        if not exchange.brokered:
            if flow.request.stream:
                # The body already went upstream unseen: never let that pass silently.
                log.error("broker.unguarded_stream", decision_id=pending[0].decision_id)
                flow.kill()
                return
            await self._broker(flow, exchange, body=flow.request.raw_content or b"")

    async def _broker(self, flow: http.HTTPFlow, exchange: Exchange, body: bytes | None) -> None:
        exchange.brokered = True
        assert exchange.pending is not None
        dctx, decision = exchange.pending
        broker = self.ctx.broker
        try:
            if broker is None:
                return  # no broker, no credentials: nothing to inject or guard
            if dctx.identity is None:
                raise RuntimeError("an allowed request without an identity")
            request = broker_request(flow, dctx, body, exchange.messages_read)
            outcome = await broker.plan(dctx.identity.tenant, dctx.identity.sandbox, request)
            if isinstance(outcome, BrokerDenial):
                await self._deny(flow, exchange, dctx, decision, outcome)
                return
            self._apply(flow, exchange, request, outcome)
            if outcome.credentials:
                exchange.credentials, exchange.injectors = outcome.credentials, outcome.injectors
                if outcome.tools:
                    # Which tool call each `tools:` credential went to (names, never values).
                    exchange.extra["broker"] = {"tools": _tool_pairs(outcome.tools)}
                METRICS.injected(dctx.identity.tenant, outcome.credentials)
            if not broker.scrubber(dctx.identity.tenant, dctx.identity.sandbox).empty:
                owner = (dctx.identity.tenant, dctx.identity.sandbox)
                # Trailers (HTTP/2: gRPC's grpc-message echoes errors) are sent after the response
                # hook, streamed or not; a WebSocket on the connection is scrubbed message by message.
                exchange.scrub = exchange.scrub_trailers = exchange.scrub_websocket = owner
                exchange.scrubbed = Scrubbed(dctx)
        except Exception:
            log.exception("hook_failed", hook="broker", decision_id=dctx.decision_id)
            fault = Decision.internal_error(decision.policy_version, mode=decision.mode)
            await self._refuse(flow, exchange, dctx, fault, extra={})

    def _apply(
        self, flow: http.HTTPFlow, exchange: Exchange, request: BrokerRequest, outcome: BrokerAllow
    ) -> None:
        if outcome.mutations:
            applied = apply_mutations(request, outcome.mutations)
            headers = http.Headers(
                [(k.encode(), v.encode()) for k, v in applied.headers if k.lower() != "host"]
            )
            if flow.request.host_header is not None:
                headers["Host"] = flow.request.host_header
            flow.request.headers = headers
            if applied.query != request.query:
                path = flow.request.path.partition("?")[0]
                flow.request.path = f"{path}?{applied.query}" if applied.query else path
            if applied.body is not None and applied.body != request.body:
                _replace_body(flow.request, applied.body)
        guard = outcome.body_guard
        if guard is not None and exchange.pending is not None:
            dctx, decision = exchange.pending
            # TenantLimits' body meter, when it set one, sees every chunk first.
            metered = flow.request.stream if callable(flow.request.stream) else None

            def check(chunk: bytes) -> bytes:
                if metered is not None:
                    out = metered(chunk)
                    chunk = out if isinstance(out, bytes) else b"".join(out)
                denial = guard.feed(chunk)
                if denial is not None:
                    denied = Decision(
                        reason=denial.reason,
                        policy_version=decision.policy_version,
                        detail="in a streamed body",
                    )
                    # The HTTP error seam cuts the upstream and sends this answer.
                    response = denied_response(denial.reason, dctx.host, dctx.decision_id)
                    exchange.refuse_now(
                        self.ctx.audit, flow, response, denied, dctx, credentials=denial.credentials
                    )
                    # Raising aborts the message: returning would let mitmproxy complete it upstream.
                    raise StreamDenied(denial.reason.value)
                return chunk

            flow.request.stream = check

    async def _deny(
        self,
        flow: http.HTTPFlow,
        exchange: Exchange,
        dctx: DecisionContext,
        decision: Decision,
        outcome: BrokerDenial,
    ) -> None:
        if outcome.foreign:
            log.warning(
                "broker.unknown_placeholder",
                decision_id=dctx.decision_id,
                cause=outcome.cause.value,
                owners=list(outcome.foreign_owners),
            )
        denial = decision.as_denial(outcome.reason, outcome.cause.value)
        extra = {
            "credentials": list(outcome.credentials),
            "where": list(outcome.where),
            "foreign": outcome.foreign,
        }
        if outcome.tools:
            extra["tools"] = _tool_pairs(outcome.tools)
        await self._refuse(flow, exchange, dctx, denial, extra=extra, section=decision.messages)

    async def _refuse(
        self,
        flow: http.HTTPFlow,
        exchange: Exchange,
        dctx: DecisionContext,
        decision: Decision,
        *,
        extra: dict[str, Any],
        section: Section | None = None,
    ) -> None:
        """403, or the protocol's own error answer for a body an `mcp:`/`jsonrpc:`/`graphql:`
        section read (an MCP session lives on); then the record."""
        response = _protocol_refusal(section, exchange, decision, dctx.decision_id) or denied_response(
            decision.reason, dctx.host, dctx.decision_id
        )
        credentials = tuple(extra.pop("credentials", ()))
        # Refused after the gate permitted its dial: nothing may dial on its account.
        exchange.withdraw_dial(self.ctx.connections.get(flow.client_conn.id))
        await exchange.refuse(
            self.ctx.audit,
            flow,
            response,
            decision,
            credentials=credentials,
            extra={"broker": extra} if extra else None,
        )

    # -- responses ---------------------------------------------------------------------------

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        exchange = Exchange.of(flow)
        owner = exchange.scrub
        if owner is None or flow.response is None or self.ctx.broker is None:
            return
        try:
            scrubber = self.ctx.broker.scrubber(*owner)
            response = flow.response
            tally = _tally(flow)
            response.headers = http.Headers(
                [
                    (k.encode(), v.encode())
                    for k, v in scrubber.scrub_headers(list(response.headers.items(multi=True)), tally)
                ]
            )
            bodiless = (
                response.status_code < 200
                or response.status_code in (204, 304)
                or flow.request.method == "HEAD"
            )
            # A stream an earlier addon set (AgentProtocols' list filter) is scrubbed behind it.
            earlier = response.stream if callable(response.stream) else None
            if not bodiless and (earlier is not None or not _response_buffered(response)):
                decoder = None
                if "content-encoding" in response.headers:
                    decoder = stream_decoder(response.headers["content-encoding"])
                    if decoder is None:
                        # An encoding it cannot undo in a stream cannot be scrubbed: no pass.
                        log.warning("broker.unscrubbable_response", host=flow.request.pretty_host)
                        flow.kill()
                        return
                    # Sent on decoded (scrubbed in its plain bytes), as identity.
                    del response.headers["content-encoding"]
                # The body streams through the scrubber (its length changes).
                response.headers.pop("content-length", None)
                if response.http_version == "HTTP/1.1":
                    response.headers["transfer-encoding"] = "chunked"
                scrub = scrubber.stream(decoder, tally)
                response.stream = scrub if earlier is None else chained(earlier, scrub)
                exchange.scrub = None
        except Exception:
            log.exception("hook_failed", hook="broker.responseheaders")
            flow.kill()

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        owner = Exchange.of(flow).scrub_websocket
        if owner is None or flow.websocket is None or self.ctx.broker is None:
            return
        message = flow.websocket.messages[-1]
        if message.from_client:
            return
        try:
            message.content = self.ctx.broker.scrubber(*owner).scrub(message.content, _tally(flow))
        except Exception:
            log.exception("hook_failed", hook="broker.websocket_message")
            message.drop()

    def sandgate_websocket_control(self, control: WebSocketControl) -> None:
        """The upstream's PING, PONG or CLOSE reaches the guest scrubbed, or ends the session.

        A CLOSE reason and a PONG are scrubbed like messages (wsproto cuts a reason to 123
        bytes at a character boundary). A PING's payload would come back in the guest's PONG,
        a placeholder on its way upstream, and a PONG that no longer fits a frame cannot be
        sent: either ends the session (1011 to the guest, 1008 upstream), logged."""
        flow = control.flow
        owner = Exchange.of(flow).scrub_websocket
        if owner is None or control.from_client or self.ctx.broker is None:
            return
        scrubbed: bytes | None
        try:
            scrubbed = self.ctx.broker.scrubber(*owner).scrub(control.payload, _tally(flow))
        except Exception:
            log.exception("hook_failed", hook="broker.websocket_control")
            scrubbed = None
        if scrubbed == control.payload:
            return
        if scrubbed is not None and _relayable(control.kind, scrubbed):
            control.payload = scrubbed
            return
        log.warning("broker.unscrubbable_websocket_control", kind=control.kind, host=flow.request.pretty_host)
        reason = f"sandgate: the upstream's {control.kind} cannot be relayed"
        close = SessionClose(CloseReason.INTERNAL_ERROR, reason, CloseReason.POLICY_VIOLATION, by_guest=False)
        request_close(flow, close)  # this hook runs only in the layer that honours it

    def response(self, flow: http.HTTPFlow) -> None:
        try:
            self._scrub_response(flow)
        finally:
            self._report(flow, "response")

    def error(self, flow: http.HTTPFlow) -> None:
        # A streamed response cut on its way may have had replacements already.
        self._report(flow, "response")

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        self._report(flow, "websocket")

    def _report(self, flow: http.HTTPFlow, scope: str) -> None:
        """Record the replacements made since the last report, if any (never waits)."""
        seen = Exchange.of(flow).scrubbed
        if seen is None or not seen.tally or self.ctx.broker is None:
            return
        counts = dict(seen.tally)
        seen.tally.clear()  # the stream scrubber keeps counting into the same dict
        try:
            identity = seen.dctx.identity
            assert identity is not None
            names = {p: c for c, p in self.ctx.broker.placeholders(identity.tenant, identity.sandbox).items()}
            by_name: dict[str, int] = {}
            for placeholder, n in counts.items():
                name = names.get(placeholder, "unknown")
                by_name[name] = by_name.get(name, 0) + n
            self.ctx.audit.emit_nowait(secret_scrubbed_record(seen.dctx, by_name, scope))
        except Exception:
            log.exception("hook_failed", hook="broker.scrub_record", decision_id=seen.dctx.decision_id)

    def _scrub_response(self, flow: http.HTTPFlow) -> None:
        self._scrub_trailers(flow)
        exchange = Exchange.of(flow)
        owner, exchange.scrub = exchange.scrub, None
        if owner is None or flow.response is None or self.ctx.broker is None:
            return
        try:
            scrubber = self.ctx.broker.scrubber(*owner)
            response = flow.response
            if "content-encoding" in response.headers:
                # Decoded, scrubbed, encoded again: a compressed echo must not slip past. Strictly:
                # an encoding mitmproxy cannot undo ("gzip, gzip", "compress", a corrupt stream)
                # would otherwise be scanned still encoded and reach the guest with its header gone.
                try:
                    content = response.get_content(strict=True) or b""
                except ValueError:
                    log.warning("broker.unscrubbable_response", host=flow.request.pretty_host)
                    flow.response = denied_response(Reason.INTERNAL_ERROR, None, "-")
                    return
                response.set_content(scrubber.scrub(content, _tally(flow)))
            elif response.raw_content:
                scrubbed = scrubber.scrub(response.raw_content, _tally(flow))
                if scrubbed != response.raw_content:
                    _replace_body(response, scrubbed)
        except Exception:
            log.exception("hook_failed", hook="broker.response")
            flow.response = denied_response(Reason.INTERNAL_ERROR, None, "-")

    def _scrub_trailers(self, flow: http.HTTPFlow) -> None:
        exchange = Exchange.of(flow)
        owner, exchange.scrub_trailers = exchange.scrub_trailers, None
        response = flow.response
        if owner is None or response is None or not response.trailers or self.ctx.broker is None:
            return
        try:
            scrubber = self.ctx.broker.scrubber(*owner)
            pairs = scrubber.scrub_headers(list(response.trailers.items(multi=True)), _tally(flow))
            response.trailers = http.Headers([(k.encode(), v.encode()) for k, v in pairs])
        except Exception:
            log.exception("hook_failed", hook="broker.trailers")
            response.trailers = None
            flow.kill()


def _tally(flow: http.HTTPFlow) -> Tally | None:
    seen = Exchange.of(flow).scrubbed
    return seen.tally if seen is not None else None


def chained(
    first: Callable[[bytes], bytes | Iterable[bytes]], then: Callable[[bytes], Iterable[bytes]]
) -> Callable[[bytes], Iterator[bytes]]:
    """A body stream: each chunk through `first`, what it gives through `then`; the end (b"")
    through both, in that order. Never yields an empty piece (on HTTP/1 that ends the body)."""

    def stream(chunk: bytes) -> Iterator[bytes]:
        out = first(chunk)
        for piece in [out] if isinstance(out, bytes) else list(out):
            if piece:
                yield from (p for p in then(piece) if p)
        if not chunk:
            yield from (p for p in then(b"") if p)

    return stream


def _relayable(kind: str, scrubbed: bytes) -> bool:
    """Whether a scrubbed control payload can go to the guest: a CLOSE reason (cut to fit), or
    a PONG that still fits its frame; never a PING (the guest's PONG would echo it upstream)."""
    return kind == "close" or (kind == "pong" and len(scrubbed) <= CONTROL_PAYLOAD_MAX)


def _replace_body(message: http.Message, body: bytes) -> None:
    """Set a raw body and its Content-Length (a placeholder and its secret differ in length)."""
    message.raw_content = body
    if "content-length" in message.headers:
        message.headers["content-length"] = str(len(body))


def _request_streamed(request: http.Request) -> bool:
    """Whether a request body is too large, or of unknown size, to buffer and scan first.

    HTTP/2 and chunked bodies without a length count as unknown: mitmproxy would start
    streaming them upstream past 1 MiB, before the broker saw them.
    """
    length = declared_length(request)
    return length > MAX_BUFFERED_BODY if length is not None else body_length_unknown(request)


def _response_buffered(response: http.Response) -> bool:
    """Whether mitmproxy will hand the `response` hook the whole body (a known, small length)."""
    length = declared_length(response)
    return length is not None and length <= MAX_BUFFERED_BODY


def _protocol_refusal(
    section: Section | None, exchange: Exchange, denial: Decision, decision_id: str
) -> http.Response | None:
    """The refusal of a body `section` read, in its protocol (every request of it answered with
    the broker's reason), or None when the body was not read as one."""
    read = exchange.messages_read
    if section is None or read is None:
        return None
    if isinstance(read, McpBody):
        rpcs = [m.rpc for m in read.messages]
    elif isinstance(read, RpcBody):
        rpcs = list(read.messages)
    else:
        rpcs = []  # GraphQL: one error object, no ids
    messages = tuple(
        MessageVerdict(
            Verdict.DENY, denial.reason, None, denial.detail, index=r.index, id=r.id, has_id=r.has_id
        )
        for r in rpcs
    )
    batch = isinstance(read, McpBody | RpcBody) and read.batch
    verdict = BodyVerdict(Verdict.DENY, denial.reason, None, denial.detail, messages, batch=batch)
    return refusal_response(section, verdict, decision_id)


def _tool_pairs(tools: Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"credential": credential, "tool": tool} for credential, tool in tools]


def broker_request(
    flow: http.HTTPFlow, dctx: DecisionContext, body: bytes | None, read: object = None
) -> BrokerRequest:
    """The broker's view of an allowed request (`body` None: too large to buffer, or none to
    see; `read`: the body as AgentProtocols read it, its MCP messages for `tools:` credentials)."""
    req = flow.request
    headers = [(k, v) for k, v in req.headers.items(multi=True)]
    if not any(k.lower() == "host" for k, _ in headers):
        headers.append(("host", req.host_header or dctx.host or ""))
    path, _, query = req.path.partition("?")
    assert dctx.host is not None and dctx.port is not None
    return BrokerRequest(
        method=req.method,
        scheme=req.scheme,
        host=dctx.host,
        port=dctx.port,
        path=path,
        query=query,
        headers=tuple(headers),
        body=body,
        body_too_large=body is None,
        mcp=read if isinstance(read, McpBody) and body is not None else None,
    )
