"""`LeanHttp1`: one decrypted HTTP/1.1 connection, one exchange at a time, without mitmproxy's
HttpLayer, with the same flows, hooks and addon work.

What it keeps from mitmproxy's general path, exchange by exchange:
- heads and bodies are read with mitmproxy's HTTP/1 functions and h11's body readers (the
  same strictness, the same CL+TE and duplicate Content-Length refusals, via the general path);
- the flow is built as `HttpStream` builds it in transparent mode (host, port, scheme from the
  tunnel's server) and the hooks run in mitmproxy's order: `requestheaders`, `request`,
  `responseheaders`, `response`, `error`; a response an addon set is answered locally through
  its two response hooks; a killed flow gets its `error` hook and the connection closes;
- bodies over `stream_large_bodies` are streamed, and stream callables (the limits' meters,
  the broker's scrubber) see each chunk and then b"" at the end; a callable that refuses (a
  limit, the broker) cuts the exchange as the error seam does;
- a response head over the caps becomes HeadGuard's 502; upstream failures are answered in
  sandgate's shape, with fixed words (`wire_errors`);
- a request whose kept-alive upstream connection closed (between requests, or while it was
  read or decided: a hold can outlast the upstream's idle timeout) goes over a new connection,
  as the general path dials one (`upstream.Redial`, its own TLS layer); this layer then uses
  that connection (`self.server`) for the requests after it.

What it hands to the general path (the guarded HttpLayer made for the tunnel, started then,
serving the rest of the connection, dialling its own upstream connection if it needs one): a
request head not complete in what was read, over the caps, or not plain
(`plain.plain_request`).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

from h11 import Data, EndOfMessage, ProtocolError
from h11._readers import Http10Reader
from h11._receivebuffer import ReceiveBuffer
from mitmproxy import http
from mitmproxy.connection import ConnectionState, Server
from mitmproxy.flow import Error
from mitmproxy.net.http import http1
from mitmproxy.net.http.validate import validate_headers
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers.http._events import ErrorCode
from mitmproxy.proxy.layers.http._hooks import (
    HttpErrorHook,
    HttpRequestHeadersHook,
    HttpRequestHook,
    HttpResponseHeadersHook,
    HttpResponseHook,
)
from mitmproxy.proxy.layers.http._http1 import make_body_reader

from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.heads import HeadLimits, head_overflow, refused_response, request_head_refusal
from sandgate.proxy.addons.http_seam import STREAM_REFUSALS
from sandgate.proxy.lean.phases import END_EMPTY_BODY, run_phase
from sandgate.proxy.lean.plain import plain_request
from sandgate.proxy.lean.upstream import Dialed, Read, Redial
from sandgate.proxy.metrics import METRICS
from sandgate.proxy.mitm.wire_errors import (
    CLIENT_GONE,
    KILLED,
    MALFORMED,
    UPSTREAM_CLOSED,
    Failure,
    failure_for,
)
from sandgate.proxy.respond import denied_response

__all__ = ["LeanHttp1"]

Commands = Generator[commands.Command, Any, Any]


class LeanHttp1(layer.Layer):
    """The lean layer of one intercepted HTTP/1.1 connection (see the module doc)."""

    def __init__(
        self, context: Any, general: layer.Layer, limits: HeadLimits | None, stream_above: int | None
    ) -> None:
        super().__init__(context)
        self.general = general  # the guarded HttpLayer made for this tunnel, not started
        self.limits = limits
        self.stream_above = stream_above  # mitmproxy's stream_large_bodies, in bytes
        self.handed_over = False
        self.closed = False
        self.draining = False  # answered and half-closed: the guest's bytes are dropped until EOF
        self.cbuf = ReceiveBuffer()
        self.sbuf = ReceiveBuffer()
        self.flow: http.HTTPFlow | None = None
        self.request_reader: Any = None  # h11 body reader of the request being read
        self.response_reader: Any = None
        self.request_body = bytearray()
        self.response_body = bytearray()
        self.awaiting_response = False
        self.answered = False  # the response head went to the client
        # The upstream connection in use: the tunnel's, or the last one dialled here (`upstream`).
        self.server: Server = context.server
        self.redials: list[Redial] = []
        self.dialing: commands.OpenConnection | None = None  # this layer waits for the last redial

    def handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        """`Layer.handle_event`, with a redialled connection's stack in between: its events go to
        it (also while this layer waits for the dial), this layer's commands for it through it."""
        if self.redials:
            owner = next((r for r in self.redials if r.owns(event)), None)
            if owner is not None:
                yield from self._from_redial(owner, owner.feed(event))
                return
        yield from self._own_event(event)

    # --- a redialled upstream connection --------------------------------------------------

    def _to_redial(self, command: commands.ConnectionCommand) -> Commands:
        """This layer's command: through the last redial's stack if it is for its server."""
        redial = self.redials[-1]
        if command.connection is not redial.server:
            yield command
        elif isinstance(command, commands.OpenConnection):
            self.dialing = command  # answered when the stack reports `Dialed`
            yield from self._from_redial(redial, redial.start())
        elif isinstance(command, commands.SendData):
            yield from self._from_redial(redial, redial.send(command.data))
        elif isinstance(command, commands.CloseConnection):
            yield from self._from_redial(redial, redial.close())
        else:  # pragma: no cover - this layer issues no other command for it
            raise AssertionError(command)

    def _from_redial(self, redial: Redial, produced: list[commands.Command]) -> Commands:
        """A redial stack's commands: what its pipe reports to this layer, the rest up."""
        for command in produced:
            if isinstance(command, Dialed):
                opening, self.dialing = self.dialing, None
                assert opening is not None
                yield from self._own_event(events.OpenConnectionCompleted(opening, command.error))
            elif isinstance(command, Read):
                if redial is not self.redials[-1] or self.handed_over:
                    continue  # a connection no longer used: closed or closing
                server = redial.server
                data = command.data
                got = events.ConnectionClosed(server) if data is None else events.DataReceived(server, data)
                yield from self._own_event(got)
            else:
                yield command

    def _own_event(self, event: events.Event) -> Commands:
        """`event` to this layer itself, as `Layer.handle_event` runs it (queued while it waits)."""
        for command in super().handle_event(event):
            if self.redials and isinstance(command, commands.ConnectionCommand):
                yield from self._to_redial(command)
            else:
                yield command

    # --- events ---------------------------------------------------------------------------

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        if self.handed_over:
            yield from self.general.handle_event(event)
            return
        client_gone = isinstance(event, events.ConnectionClosed) and event.connection is self.context.client
        if self.draining and client_gone:
            self.draining = False
            yield commands.CloseConnection(self.context.client)
            return
        if self.closed:
            return  # what a draining guest still sends is dropped
        client, server = self.context.client, self.server
        # Start: mitmproxy chooses this layer on the tunnel's first bytes, which come next.
        if isinstance(event, events.DataReceived) and event.connection is client:
            self.cbuf += event.data
            if self.flow is not None and self.request_reader is not None:
                yield from self._request_body()
            elif self.flow is not None and self.limits is not None and len(self.cbuf) > self.limits.max_bytes:
                # Pipelined while a response is pending, over the cap: as in HTTP/1, closed.
                yield from self._refuse_head("pipelined")
        elif isinstance(event, events.DataReceived) and event.connection is server:
            self.sbuf += event.data
            if self.awaiting_response:
                yield from self._response(eof=False)
            elif self.flow is None:
                # Bytes after an answer ended (as mitmproxy's HTTP/1 client): that upstream goes.
                self.sbuf = ReceiveBuffer()
                yield commands.CloseConnection(server)
            elif self.limits is not None and len(self.sbuf) > self.limits.max_bytes:
                yield from self._fail(MALFORMED)  # an early answer, larger than any head
            # else: an early answer, read once the request is sent
        elif isinstance(event, events.ConnectionClosed) and event.connection is server:
            if self.awaiting_response:
                yield from self._response(eof=True)
            elif server.state is not ConnectionState.CLOSED:
                # Between requests, or before this one was sent: the next needs a new connection.
                yield commands.CloseConnection(server)
        elif isinstance(event, events.ConnectionClosed) and event.connection is client:
            if self.flow is not None and self.flow.live:
                yield from self._fail(CLIENT_GONE)
            yield from self._close()
        yield from self._serve_waiting_requests()

    def _serve_waiting_requests(self) -> Commands:
        """Serve each request whose bytes are here, one after the other: a loop, not a call per
        request, so a guest pipelining thousands of refused requests deepens no stack."""
        while self.flow is None and self.cbuf and not (self.closed or self.handed_over):
            yield from self._next_request()

    # --- the request ------------------------------------------------------------------------

    def _refuse_head(self, problem: str) -> Commands:
        assert self.limits is not None
        received = len(self.cbuf)
        self.cbuf = ReceiveBuffer()
        flow = self.flow
        if flow is not None and flow.live:
            # The exchange in flight ends with the connection (its record says so), first.
            flow.error, flow.live = Error(CLIENT_GONE.text), False
            yield from run_phase(flow, HttpErrorHook(flow))
        self.closed = True
        self.flow = None
        yield from request_head_refusal(self.context.client, problem, self.limits, received)
        if self.server.state is not ConnectionState.CLOSED:
            yield commands.CloseConnection(self.server)

    def _next_request(self) -> Commands:
        server = self.server
        raw = bytes(self.cbuf)
        if not raw:
            return
        if self.limits is not None and head_overflow(b"", raw, len(raw), self.limits):
            yield from self._hand_over(raw, "over_caps")  # refused there, as HTTP/1 refuses it
            return
        lines = self.cbuf.maybe_extract_lines()
        if lines is None:
            yield from self._hand_over(raw, "partial_head")  # read and timed there
            return
        plain = plain_request([bytes(x) for x in lines], strict=self.context.options.validate_inbound_headers)
        if plain is None:
            yield from self._hand_over(raw, "not_plain")
            return
        request, size = plain
        assert server.address is not None
        request.data.host, request.data.port = server.address
        request.scheme = "https" if server.tls else "http"
        yield from self._request_head(request, size)

    def _hand_over(self, raw: bytes, reason: str) -> Commands:
        """The general path serves this request and the rest of the connection."""
        METRICS.lean_handover(reason)
        if self.redials and self.server.state is not ConnectionState.CLOSED:
            # The general path knows the tunnel's connection only: it dials its own.
            yield commands.CloseConnection(self.server)
        self.handed_over = True
        self.cbuf = ReceiveBuffer()
        self.context.layers.append(self.general)
        yield from self.general.handle_event(events.Start())
        yield from self.general.handle_event(events.DataReceived(self.context.client, raw))

    def _request_head(self, request: http.Request, size: int) -> Commands:
        flow = self.flow = http.HTTPFlow(self.context.client, self.server, live=True)
        flow.request = request
        self.answered = False
        self.request_body.clear()
        if self.stream_above is not None and size > self.stream_above:
            request.stream = True
        if size == 0:  # no body: both request hooks in one phase
            yield from run_phase(flow, HttpRequestHeadersHook(flow), END_EMPTY_BODY, HttpRequestHook(flow))
            yield from self._after_request()
            return
        yield from run_phase(flow, HttpRequestHeadersHook(flow))
        if (yield from self._ended()):
            return
        self.request_reader = make_body_reader(size)
        if flow.request.stream:
            if flow.response is not None:  # refused before its body: answered now
                yield from self._answer_now()
                return
            if not (yield from self._send_request_head()):
                return
        yield from self._request_body()

    def _request_body(self) -> Commands:
        flow, reader = self.flow, self.request_reader
        assert flow is not None and reader is not None
        streamed = bool(flow.request.stream)
        try:
            while isinstance(event := reader(self.cbuf), Data):
                if streamed:
                    yield from self._forward(flow.request, bytes(event.data), self.server, up=True)
                else:
                    self.request_body += event.data
        except STREAM_REFUSALS:
            yield from self._cut()
            return
        except ProtocolError:  # h11's Content-Length reader raises only at EOF
            self.request_reader = None
            yield from self._fail(KILLED)
            return
        if event is None:
            return  # more to come
        self.request_reader = None
        flow.request.timestamp_end = time.time()
        if streamed:
            try:
                yield from self._forward(flow.request, b"", self.server, up=True, end=True)
            except STREAM_REFUSALS:
                yield from self._cut()
                return
            yield from run_phase(flow, HttpRequestHook(flow))
            if not (yield from self._ended()):
                self.awaiting_response = True
                if self.sbuf:
                    yield from self._response(eof=False)
            return
        flow.request.data.content = bytes(self.request_body)
        self.request_body.clear()
        yield from run_phase(flow, HttpRequestHook(flow))
        yield from self._after_request()

    def _after_request(self) -> Commands:
        """The request's hooks ran: stop on a kill, answer locally, or send it upstream."""
        flow = self.flow
        assert flow is not None
        if (yield from self._ended()):
            return
        if flow.response is not None:
            flow.response.timestamp_start = time.time()
            yield from run_phase(flow, HttpResponseHeadersHook(flow))
            if not (yield from self._ended()):
                yield from self._send_response()
            return
        if not (yield from self._send_request_head(flow.request.raw_content or b"")):
            return
        self.awaiting_response = True
        if self.sbuf:
            yield from self._response(eof=False)

    def _send_request_head(self, body: bytes = b"") -> Generator[commands.Command, Any, bool]:
        """The request head (and `body`, a whole one, in the same write) to the upstream."""
        flow, server = self.flow, self.server
        assert flow is not None
        if server.timestamp_start is not None and server.state is not ConnectionState.OPEN:
            # The upstream closed its kept-alive connection while this request was read or
            # decided (a hold for approval can outlast its idle timeout): a new connection, as
            # the general path dials one. Only this request goes on it.
            server = yield from self._redial(flow)
        if server.state is ConnectionState.CLOSED:
            error = yield commands.OpenConnection(server)
            if error:
                yield from self._fail(failure_for(ErrorCode.CONNECT_FAILED, str(error)))
                return False
            if (yield from self._ended()):
                return False  # the guest left while the connection was made: nothing is sent
        # One write: each SendData is a TLS record and a socket write.
        yield commands.SendData(server, http1.assemble_request_head(flow.request) + body)
        return True

    def _redial(self, flow: http.HTTPFlow) -> Generator[commands.Command, Any, Server]:
        """A new server to the same address for `flow` and the requests after it (not opened)."""
        old = self.server
        if old.state is not ConnectionState.CLOSED:
            yield commands.CloseConnection(old)  # half-closed by the upstream
        redial = Redial(self.context, old)
        # A tunnel that redials often keeps no old stacks: those no event can reach go.
        self.redials = [r for r in self.redials if not r.finished] + [redial]
        self.sbuf = ReceiveBuffer()  # what the old connection sent is never this answer
        self.server = flow.server_conn = redial.server
        return redial.server

    # --- the response -----------------------------------------------------------------------

    def _response(self, *, eof: bool) -> Commands:
        flow = self.flow
        assert flow is not None
        if self.response_reader is None:
            response = yield from self._response_head(eof)
            if response is None:
                return
        yield from self._response_body(eof)

    def _response_head(self, eof: bool) -> Generator[commands.Command, Any, http.Response | None]:
        flow = self.flow
        assert flow is not None
        while True:
            if self.limits is not None:
                problem = head_overflow(b"", bytes(self.sbuf), len(self.sbuf), self.limits)
                if problem is not None:
                    yield from self._refused_response_head(problem)
                    return None
            lines = self.sbuf.maybe_extract_lines()
            if lines is None:
                if eof:
                    yield from self._fail(UPSTREAM_CLOSED)
                return None
            if not lines:
                continue  # an empty line before the status line: skipped, as h11 skips it
            try:
                response = http1.read_response_head([bytes(x) for x in lines])
                size = http1.expected_http_body_size(flow.request, response)
            except (ValueError, IndexError):
                yield from self._fail(MALFORMED)
                return None
            if response.status_code >= 200 or response.status_code == 101:
                break
            # 1xx (103 Early Hints, an unasked 100): informational, not forwarded.
        flow.response = response
        if self.context.options.validate_inbound_headers and not _valid_headers(response):
            yield from self._fail(failure_for(ErrorCode.RESPONSE_VALIDATION_FAILED, "invalid headers"))
            return None
        self.response_body.clear()
        if self.stream_above is not None and size is not None and size > self.stream_above:
            response.stream = True
        yield from run_phase(flow, HttpResponseHeadersHook(flow))
        if (yield from self._ended()):
            return None
        if flow.response.status_code == 101:
            # No upgrade is asked on this path, and no addon refused the switch: not served.
            yield from self._fail(MALFORMED)
            return None
        self.response_reader = make_body_reader(size)
        if flow.response.stream:
            yield from self._send_response_head()
        return response

    def _refused_response_head(self, problem: str) -> Commands:
        """HeadGuard's 502 for a response head over the caps; the upstream goes."""
        flow = self.flow
        assert flow is not None
        self.awaiting_response = False
        self.sbuf = ReceiveBuffer()
        yield commands.CloseConnection(self.server)
        flow.response = refused_response(502, Reason.HEADER_TOO_LARGE, None, problem)
        yield from run_phase(flow, HttpResponseHeadersHook(flow))
        if not (yield from self._ended()):
            yield from self._send_response(close=True)

    def _response_body(self, eof: bool) -> Commands:
        flow, reader = self.flow, self.response_reader
        assert flow is not None and flow.response is not None and reader is not None
        try:
            while True:
                event = reader(self.sbuf)
                if event is None and eof:
                    event = reader.read_eof()  # what is left can only end here (or not at all)
                if not isinstance(event, Data):
                    break
                if flow.response.stream:
                    yield from self._forward(flow.response, bytes(event.data), self.context.client, up=False)
                    continue
                self.response_body += event.data
                if self.stream_above is not None and len(self.response_body) > self.stream_above:
                    yield from self._stream_from_here()
        except STREAM_REFUSALS:
            yield from self._cut()
            return
        except ProtocolError:
            yield from self._fail(UPSTREAM_CLOSED if eof else MALFORMED)
            return
        if event is None:
            return
        assert isinstance(event, EndOfMessage)
        if event.headers:  # trailers: never relayed; the Trailers addon refuses the answer
            flow.response.trailers = http.Headers(list(event.headers.raw_items()))
        self.response_reader = None
        self.awaiting_response = False
        if flow.response.stream:
            try:
                yield from self._forward(flow.response, b"", self.context.client, up=False, end=True)
            except STREAM_REFUSALS:
                yield from self._cut()
                return
        else:
            flow.response.data.content = bytes(self.response_body)
            self.response_body.clear()
        yield from self._send_response(close=eof or isinstance(reader, Http10Reader))

    def _stream_from_here(self) -> Commands:
        """A response body grew past `stream_large_bodies`: stream it from here (as mitmproxy)."""
        flow = self.flow
        assert flow is not None and flow.response is not None
        flow.response.stream = True
        yield from self._send_response_head()
        held = bytes(self.response_body)
        self.response_body.clear()
        yield from self._forward(flow.response, held, self.context.client, up=False)

    def _send_response_head(self) -> Commands:
        flow = self.flow
        assert flow is not None and flow.response is not None
        self.answered = True
        yield commands.SendData(self.context.client, http1.assemble_response_head(flow.response))

    def _send_response(self, *, close: bool = False, drain: bool = False) -> Commands:
        """The response hook, then the response (unless streamed), then keep-alive or close."""
        flow = self.flow
        assert flow is not None and flow.response is not None
        flow.response.timestamp_end = time.time()
        yield from run_phase(flow, HttpResponseHook(flow))
        if (yield from self._ended(error_hook=False)):
            return
        response, request, client = flow.response, flow.request, self.context.client
        chunked = _chunked(response)
        parts = []  # sent in one write: each SendData is a TLS record and a socket write
        if not self.answered:
            self.answered = True
            parts.append(http1.assemble_response_head(response))
            content = response.raw_content
            if content:
                parts.append(_frame(content) if chunked else content)
        if chunked and request.method.upper() != "HEAD":
            parts.append(b"0\r\n\r\n")
        if parts:
            yield commands.SendData(client, b"".join(parts))
        flow.live = False
        self.flow = None
        METRICS.lean_exchange()
        if self.sbuf:
            # Bytes past the answer's end (as mitmproxy's HTTP/1 client): never the next answer.
            self.sbuf = ReceiveBuffer()
            yield commands.CloseConnection(self.server)
        if close or _connection_done(request, response):
            yield from self._close(drain=drain)
        # A request waiting behind this one is served by the caller's loop.

    # --- bodies through stream callables --------------------------------------------------------

    def _forward(
        self, message: http.Message, data: bytes, to: Any, *, up: bool, end: bool = False
    ) -> Commands:
        """`data` through the message's stream callable (if any) to `to`; counted for its record.
        `end`: the body ended (the callable gets b"")."""
        stream = message.stream
        if callable(stream):
            out = stream(data)
            chunks = [out] if isinstance(out, bytes) else list(out)
        else:
            chunks = [data]
        chunked = _chunked(message)
        flow = self.flow
        assert flow is not None
        counted = Exchange.of(flow).streamed
        for chunk in chunks:
            if not chunk:
                continue  # an empty chunk would end a chunked body
            if up:
                counted.up += len(chunk)
            else:
                counted.down += len(chunk)
            yield commands.SendData(to, _frame(chunk) if chunked else chunk)
        if end and up and chunked:
            yield commands.SendData(to, b"0\r\n\r\n")

    # --- endings --------------------------------------------------------------------------------

    def _ended(self, *, error_hook: bool = True) -> Generator[commands.Command, Any, bool]:
        """After a phase: a killed or failed flow, or one whose guest left while the phase
        waited (as mitmproxy's check_killed sees it), gets its error hook (not after the
        response hook, as in mitmproxy) and the connection closes."""
        flow = self.flow
        assert flow is not None
        if flow.error is None and self._client_left():
            flow.error = Error(CLIENT_GONE.text)
        if flow.error is None:
            return False
        flow.live = False
        if error_hook:
            yield from run_phase(flow, HttpErrorHook(flow))
        yield from self._close()
        return True

    def _client_left(self) -> bool:
        """The guest's close waits among the events queued while a phase waited."""
        client = self.context.client
        queued = self._paused_event_queue
        return any(isinstance(e, events.ConnectionClosed) and e.connection is client for e in queued)

    def _answer_now(self) -> Commands:
        """A refusal of a request whose body is streamed: answered before its body, then closed
        (the error seam's answer: the response hook runs as for any answered request)."""
        flow = self.flow
        assert flow is not None and flow.response is not None
        flow.response.headers["Connection"] = "close"
        yield from self._send_response(close=True, drain=True)

    def _cut(self) -> Commands:
        """A stream callable refused its body (a limit, the broker; already audited)."""
        flow = self.flow
        assert flow is not None
        flow.live = False
        if flow.response is not None and not self.answered:
            flow.response.headers["Connection"] = "close"  # its refusal, answered
            yield from self._send_response(close=True, drain=True)
            return
        if flow.error is None:
            flow.error = Error(KILLED.text)
        yield from run_phase(flow, HttpErrorHook(flow))
        yield from self._close()

    def _fail(self, failure: Failure) -> Commands:
        """The exchange failed (an upstream that cannot be reached or broke the protocol, a
        client gone): its error hook with fixed words, sandgate's answer if none was sent."""
        flow = self.flow
        assert flow is not None
        if flow.error is None:
            flow.error = Error(failure.text)
        flow.live = False
        self.awaiting_response = False
        # The allowed request's decision, named in the answer (read before its record completes).
        pending = Exchange.of(flow).pending
        decided = (pending[0].decision_id, pending[0].host) if pending else None
        yield from run_phase(flow, HttpErrorHook(flow))
        client = self.context.client
        writable = bool(client.state & ConnectionState.CAN_WRITE)
        if failure.reason is not None and decided is not None and not self.answered and writable:
            decision_id, host = decided
            response = denied_response(failure.reason, host, decision_id, status=failure.status, close=True)
            yield commands.SendData(client, http1.assemble_response(response))
            yield from self._close(drain=True)
            return
        yield from self._close()

    def _close(self, *, drain: bool = False) -> Commands:
        """Close both connections; `drain`: after an answer the guest may still be sending to,
        only half-close its side and drop what it sends until it closes (a full close with
        unread bytes would reset the connection before the answer is read)."""
        if self.closed:
            return
        self.closed = True
        self.flow = None
        server, client = self.server, self.context.client
        if server.state is not ConnectionState.CLOSED:
            yield commands.CloseConnection(server)
        if drain and client.state & ConnectionState.CAN_WRITE:
            self.draining = True
            yield commands.CloseTcpConnection(client, half_close=True)
        elif client.state is not ConnectionState.CLOSED:
            yield commands.CloseConnection(client)


def _connection_done(request: http.Request, response: http.Response) -> bool:
    """mitmproxy's HTTP/1 rule: a connection ends after an answer framed by its close, or when
    either side said `Connection: close`."""
    try:
        until_close = http1.expected_http_body_size(request, response) == -1
    except ValueError:
        until_close = False  # headers an addon set that frame nothing: as mitmproxy, not this
    return (
        until_close
        or http1.connection_close(request.http_version, request.headers)
        or http1.connection_close(response.http_version, response.headers)
    )


def _valid_headers(response: http.Response) -> bool:
    """mitmproxy's check against smuggling (CL with TE, invalid names, ...), as its HTTP layer runs it."""
    try:
        validate_headers(response)
    except ValueError:
        return False
    return True


def _chunked(message: http.Message) -> bool:
    return "chunked" in message.headers.get("transfer-encoding", "").lower()


def _frame(chunk: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(chunk), chunk)
