"""Addon: mitmproxy's own HTTP refusals, answered and audited the sandgate way.

mitmproxy 12.3 answers what it cannot parse itself: a request (CL+TE, duplicate
Content-Length, userinfo, a bad CONNECT port, garbage) before any hook sees a flow, and an
upstream answer (a header line without a colon, a bad Content-Length). Its HTML page quotes
the offending bytes, which an upstream can fill with a secret the gateway injected; the
same text lands in `flow.error` (the audit trail) and the log, and the refused request is
never audited. A refusal of a request whose body it streams crashes the connection handler.

The seam: every `HttpLayer` mitmproxy picks is swapped (in `next_layer`) for a subclass whose
HTTP/1 server and streams
- answer in sandgate's shape (status, `X-Sandgate-Reason`, JSON body with the decision id),
  never with wire bytes, and audit each refusal no hook saw (`invalid_request`);
- turn every protocol error message into a fixed category (`wire_errors`) before a hook,
  the audit trail or the log sees it;
- answer a denial of a streamed request at once (mitmproxy raises on it) and cut a streamed
  body that a limit or the broker refused (they raise to stop it) without a crash.
The layer API is mitmproxy's internals, pinned to 12.3.x: `check_seam()` runs at start-up
and fails loudly when it has moved.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import replace
from typing import Any, cast

import structlog
from mitmproxy import connection, http, version
from mitmproxy.flow import Error
from mitmproxy.net.http import http1
from mitmproxy.options import Options
from mitmproxy.proxy import commands, context, events, layer
from mitmproxy.proxy.layers.http import DropStream, HttpLayer, HTTPMode, HttpStream, SendHttp
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import (
    ErrorCode,
    RequestData,
    RequestProtocolError,
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
    ResponseProtocolError,
)
from mitmproxy.proxy.layers.http._hooks import HttpErrorHook, HttpResponseHook
from mitmproxy.proxy.layers.http._http1 import Http1Server

from sandgate.brokers.decoding import UndecodableBody
from sandgate.policy.decision import Decision, Identity, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.agent_protocols import ProtocolBodyRefused
from sandgate.proxy.addons.credential_broker import StreamDenied
from sandgate.proxy.addons.exchange import Exchange, exchange_context
from sandgate.proxy.addons.limits import LimitStreamCut
from sandgate.proxy.audit.records import decision_record
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.errors import ProxyError
from sandgate.proxy.mitm.wire_errors import INVALID_REQUEST, KILLED, Failure, failure_for, failure_of_text
from sandgate.proxy.respond import denied_response
from sandgate.proxy.tasks import TaskSet

__all__ = ["STREAM_REFUSALS", "HttpErrorSeam", "SeamMoved", "check_seam"]

log = structlog.get_logger("sandgate.http_seam")

SUPPORTED = "12.3."
# What a refused streamed body raises from its stream callable to stop mitmproxy forwarding it
# (a limit, the broker, a refused JSON-RPC body).
# A compressed body that does not decode is cut too: it could not be scrubbed.
STREAM_REFUSALS = (LimitStreamCut, StreamDenied, ProtocolBodyRefused, UndecodableBody)

Commands = Generator[commands.Command, Any, Any]
Record = Callable[[dict[str, Any]], None]


class SeamMoved(ProxyError):
    """mitmproxy's HTTP layer no longer has the shape sandgate's error seam relies on."""


class _Seam:
    """What the guarded layers need: the gateway context and a way to queue a record.

    `self_test`: the start-up check's (check_seam), whose record reaches no trail, so its
    refusal is no decision of the gateway's and is not counted in the metrics either.
    """

    def __init__(self, ctx: GatewayContext | None, record: Record, *, self_test: bool = False) -> None:
        self.ctx = ctx
        self.record = record
        self.self_test = self_test

    def refusal(
        self, client: connection.Client, failure: Failure, identity: Identity | None = None
    ) -> tuple[str, str | None]:
        """Audit a refusal that no hook decided; (decision id, host) for the answer."""
        state = self.ctx.connections.get(client.id) if self.ctx is not None else None
        dctx = exchange_context(state, client, Phase.REQUEST)
        if state is not None and dctx.host is None and state.original_dst is not None:
            # Transparent, before a tunnel: where the guest was connecting.
            dctx = replace(dctx, host=state.original_dst[0], port=state.original_dst[1])
        if identity is not None:
            dctx = replace(dctx, identity=identity)
        decision = Decision(
            reason=failure.reason or Reason.INVALID_REQUEST,
            policy_version=self.ctx.policy.version if self.ctx is not None else "",
            detail=failure.text,
        )
        record = decision_record(
            dctx, decision, status=failure.status, error=failure.text, count=not self.self_test
        )
        self.record(record)
        return dctx.decision_id, dctx.host


class _GuardedHttp1Server(Http1Server):
    """mitmproxy's HTTP/1 server, but a request head it cannot parse gets sandgate's 400."""

    def __init__(self, ctx: context.Context, seam: _Seam) -> None:
        super().__init__(ctx)
        self.seam = seam

    def read_headers(self, event: events.ConnectionEvent) -> Commands:
        if isinstance(event, events.ConnectionClosed):
            # mitmproxy would log the half-sent head with its bytes; nothing was asked.
            yield commands.CloseConnection(self.conn)
            return
        refused = False
        # Only the error page is sent from here: mitmproxy's read_headers sends nothing else.
        for command in super().read_headers(event):
            if isinstance(command, commands.SendData):
                refused = True
                detail = _head_detail(self.request)
                failure = Failure(detail, INVALID_REQUEST.reason, INVALID_REQUEST.status)
                decision_id, host = self.seam.refusal(self.context.client, failure)
                response = denied_response(Reason.INVALID_REQUEST, host, decision_id, close=True)
                yield commands.SendData(self.conn, _assemble(response))
            elif isinstance(command, commands.Log) or (refused and isinstance(command, ReceiveHttp)):
                # No flow for a refused head: no hook decides it, no log line quotes it.
                continue
            else:
                yield command


class _GuardedStream(HttpStream):
    """mitmproxy's HTTP stream, with errors in fixed words and answered in sandgate's shape."""

    def __init__(self, ctx: context.Context, stream_id: int, seam: _Seam) -> None:
        super().__init__(ctx, stream_id)
        self.seam = seam
        self.answered = False
        self.decided: tuple[str, str | None] | None = None

    def _handle_event(self, event: events.Event) -> Commands:
        if isinstance(event, ResponseData | ResponseEndOfMessage) and self.server_state == self.state_done:
            # Bytes an upstream sends after its answer ended (an h2c server's SETTINGS right
            # behind a 101 the gateway refused): nobody reads them; mitmproxy would crash.
            return _nothing()
        return self._guarded(super()._handle_event(event))

    def handle_protocol_error(self, event: RequestProtocolError | ResponseProtocolError) -> Commands:
        failure = failure_for(event.code, event.message)
        return super().handle_protocol_error(type(event)(event.stream_id, failure.text, event.code))

    def start_request_stream(self) -> Commands:
        if self.flow.response is None:
            return (yield from super().start_request_stream())
        # A refusal of a request whose body mitmproxy streams (it would raise): answer now.
        # The response hook runs as for any answered request (addons that count flows end it).
        self.client_state = self.state_errored
        yield HttpResponseHook(self.flow)
        self.flow.live = False
        response = cast(http.Response | None, self.flow.response)  # a hook may have taken it
        if response is not None:
            yield from self._answer(response)
        else:
            yield SendHttp(
                ResponseProtocolError(self.stream_id, KILLED.text, ErrorCode.KILL), self.context.client
            )
        return None

    def _guarded(self, inner: Commands) -> Commands:
        """Drive mitmproxy's generator; scrub, answer and cut on the way out."""
        reply: Any = None
        while True:
            self._scrub()
            try:
                command = inner.send(reply)
            except StopIteration as stop:
                self._scrub()
                return stop.value
            except STREAM_REFUSALS:
                # A limit or the broker stopped a streamed body (already audited): cut it.
                yield from self._cut()
                return None
            self._scrub()
            if isinstance(command, SendHttp) and isinstance(command.event, RequestData | ResponseData):
                if not command.event.data:
                    # On HTTP/1 an empty chunk ends a chunked body: the rest would never arrive.
                    reply = None
                    continue
                self._count_streamed(command.event)
            if isinstance(command, SendHttp) and command.connection is self.context.client:
                if isinstance(command.event, ResponseProtocolError):
                    yield from self._refuse(command.event)
                    reply = None
                    continue
                if isinstance(command.event, ResponseHeaders):
                    self.answered = True
            reply = yield command

    def _count_streamed(self, event: RequestData | ResponseData) -> None:
        """Count a streamed body's bytes for its record (its content is not kept to count)."""
        flow = self.flow
        up = isinstance(event, RequestData)
        message = flow.request if up else flow.response
        if message is None or not message.stream:
            return
        counted = Exchange.of(flow).streamed
        if up:
            counted.up += len(event.data)
        else:
            counted.down += len(event.data)

    def _scrub(self) -> None:
        """Fixed words in flow.error before any hook, record or log reads it; note the decision."""
        flow = getattr(self, "flow", None)
        if flow is None:
            return
        if flow.error is not None:
            flow.error.msg = failure_of_text(flow.error.msg).text
        if self.decided is None:
            # An exchange is allowed once: its decision, once seen, is the one to name.
            pending = Exchange.of(flow).pending
            if pending is not None:
                self.decided = (pending[0].decision_id, pending[0].host)

    def _refuse(self, event: ResponseProtocolError) -> Commands:
        failure = failure_for(event.code, event.message)
        if self.answered or failure.reason is None or failure.status is None:
            yield SendHttp(
                ResponseProtocolError(event.stream_id, failure.text, event.code), self.context.client
            )
            return
        decided = self.decided
        if decided is None:
            flow = getattr(self, "flow", None)
            identity = Exchange.of(flow).identity if flow is not None else None
            decided = self.seam.refusal(self.context.client, failure, identity)
        decision_id, host = decided
        response = denied_response(
            failure.reason, host, decision_id, status=failure.status, close=not self._h2
        )
        yield from self._answer(response)

    def _answer(self, response: http.Response) -> Commands:
        """Send `response` to the client and end the exchange (HTTP/1: no more requests on it)."""
        client = self.context.client
        if self._h2:
            response.headers.pop("Connection", None)
        else:
            response.headers["Connection"] = "close"  # said, so no client reuses it
        yield SendHttp(ResponseHeaders(self.stream_id, response, end_stream=False), client)
        if response.raw_content:
            yield SendHttp(ResponseData(self.stream_id, response.raw_content), client)
        yield SendHttp(ResponseEndOfMessage(self.stream_id), client)
        self.answered = True
        if self._h2:
            # Stop the guest's body on this stream; the connection's other streams go on.
            yield SendHttp(ResponseProtocolError(self.stream_id, KILLED.text, ErrorCode.CANCEL), client)
        else:
            # The answer, then EOF: what the guest still sends is read and dropped until it ends.
            yield commands.CloseTcpConnection(client, half_close=True)

    def _cut(self) -> Commands:
        self.flow.live = False
        self.client_state = self.server_state = self.state_errored
        # The upstream never sees the end of the message: its connection (or h2 stream) goes.
        yield SendHttp(RequestProtocolError(self.stream_id, KILLED.text, ErrorCode.KILL), self.context.server)
        # The flow ends through a hook as any other does (addons that count flows end it).
        if self.flow.response is not None and not self.answered:
            yield HttpResponseHook(self.flow)
        if self.flow.response is not None and not self.answered:
            yield from self._answer(self.flow.response)
        else:
            if self.flow.error is None:
                self.flow.error = Error(KILLED.text)
            yield HttpErrorHook(self.flow)
            yield SendHttp(
                ResponseProtocolError(self.stream_id, KILLED.text, ErrorCode.KILL), self.context.client
            )
        yield DropStream(self.stream_id)

    @property
    def _h2(self) -> bool:
        return self.context.client.alpn == b"h2"


class _GuardedHttpLayer(HttpLayer):
    """mitmproxy's HTTP layer with the guarded HTTP/1 server and streams."""

    def __init__(self, ctx: context.Context, mode: HTTPMode, seam: _Seam) -> None:
        super().__init__(ctx, mode)
        self.seam = seam

    def _handle_event(self, event: events.Event) -> Commands:
        client = self.context.client
        if (
            isinstance(event, events.Start)
            and client not in self.connections
            and client.alpn in (None, b"", b"http/1.1")
        ):
            # mitmproxy's Start keeps a server connection that is already set (setdefault).
            self.connections[client] = _GuardedHttp1Server(self.context.fork(), self.seam)
        yield from super()._handle_event(event)

    def make_stream(self, stream_id: int) -> Commands:
        self.streams[stream_id] = _GuardedStream(self.context.fork(), stream_id, self.seam)
        yield from self.event_to_child(self.streams[stream_id], events.Start())


def _guard(chosen: layer.Layer | None, seam: _Seam) -> layer.Layer | None:
    """`chosen` with every plain HttpLayer in its chain replaced by the guarded one."""
    if chosen is None:
        return None
    if type(chosen) is HttpLayer:
        return _GuardedHttpLayer(chosen.context, chosen.mode, seam)
    child = getattr(chosen, "child_layer", None)
    if isinstance(child, layer.Layer):
        chosen.child_layer = _guard(child, seam)  # type: ignore[attr-defined]
    return chosen


class HttpErrorSeam:
    """Puts the guarded HTTP layer wherever mitmproxy chose its own (after NextLayer)."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self._seam = _Seam(ctx, self._emit)
        self._tasks = TaskSet()

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        try:
            nextlayer.layer = _guard(nextlayer.layer, self._seam)
        except Exception:
            log.exception("hook_failed", hook="http_seam.next_layer")
            # Fail closed: no layer that would answer with mitmproxy's own error pages.
            nextlayer.context.client.error = "sandgate: internal error"
            nextlayer.layer = None

    def _emit(self, record: dict[str, Any]) -> None:
        # Layers are synchronous: queue the record as a denial's would be (bounded wait).
        self._tasks.spawn(self.ctx.audit.emit(record), name="sandgate-seam-audit")


def check_seam() -> None:
    """Fail loudly when mitmproxy's HTTP layer no longer has the shape the seam relies on.

    Checks the version series, the hooks the subclasses override, and runs a garbage request
    head through a guarded HTTP/1 server: it must answer sandgate's 400 without the bytes.
    """
    if not version.VERSION.startswith(SUPPORTED):
        raise SeamMoved(f"sandgate's HTTP error seam supports mitmproxy {SUPPORTED}x, not {version.VERSION}")
    expected = {
        HttpLayer: ("_handle_event", "make_stream", "event_to_child", "connections", "streams"),
        HttpStream: (
            "_handle_event",
            "handle_protocol_error",
            "start_request_stream",
            "state_stream_request_body",
            "check_invalid",
            "state_errored",
        ),
        Http1Server: ("read_headers", "send"),
    }
    for cls, names in expected.items():
        missing = [n for n in names if not hasattr(cls, n) and n not in getattr(cls, "__annotations__", {})]
        if missing:
            raise SeamMoved(f"mitmproxy {cls.__name__} lacks {', '.join(missing)}")
    marker = b"sandgate-seam-check"
    records: list[dict[str, Any]] = []
    client = connection.Client(peername=("127.0.0.1", 1), sockname=("127.0.0.1", 2), timestamp_start=0.0)
    server = _GuardedHttp1Server(
        context.Context(client, Options()), _Seam(None, records.append, self_test=True)
    )
    sent = b""
    list(server.handle_event(events.Start()))
    for command in server.handle_event(
        events.DataReceived(client, b"GET /" + marker + b" HTTP/1.1 x\r\n\r\n")
    ):
        if isinstance(command, commands.SendData):
            sent += command.data
    if (
        not sent.startswith(b"HTTP/1.1 400")
        or marker in sent
        or b"X-Sandgate-Reason: invalid_request" not in sent
    ):
        raise SeamMoved("mitmproxy's HTTP/1 server no longer answers a bad head through the seam")
    if len(records) != 1 or records[0]["reason"] != Reason.INVALID_REQUEST.value:
        raise SeamMoved("mitmproxy's HTTP/1 server no longer reports a bad head through the seam")


def _nothing() -> Commands:
    yield from ()


def _head_detail(request: http.Request | None) -> str:
    """A fixed word for what was wrong with a request head mitmproxy refused."""
    if request is not None:
        return "ambiguous message framing"
    return "unparseable request head"


def _assemble(response: http.Response) -> bytes:
    data: bytes = http1.assemble_response(response)
    return data
