"""Spike (issue 29, item 2): the CEILING of a lean HTTP/1.1 layer inside intercepted tunnels.

Load with `mitmdump -s bench/lean_layer_spike.py`. Where mitmproxy's own NextLayer addon would
put its decrypted-HTTP layer (`HttpLayer(context, HTTPMode.transparent)`) right after the
ClientTLSLayer of an intercepted CONNECT tunnel, this addon puts `LeanHttp1` instead: a
minimal sans-io layer that parses each request and response head with mitmproxy's own
HTTP/1 functions (`read_request_head`, `read_response_head`, `expected_http_body_size`, the
h11 body readers that mitmproxy's Http1Connection uses, so the same strictness and the same
CL+TE / duplicate Content-Length refusals), forwards it (re-assembled with
`assemble_request_head` / `assemble_response_head`, bodies streamed, chunked re-chunked), and
keeps the connection alive. No flows, no hooks, no addon work at all: it measures what is
left of mitmproxy per request once its HttpLayer, HttpStream and hook tasks are gone.

Not production code: no pipelining, no upgrades (101 / CONNECT in the tunnel get a 501 and
a close), no head size cap, no trailers, no 1xx. Everything else (HTTP/2 by ALPN, raw TCP,
ignore_hosts, plain HTTP via the proxy) is left to mitmproxy's NextLayer addon.
"""

from __future__ import annotations

import sys
from collections.abc import Generator

from h11 import Data, ProtocolError
from h11._readers import Http10Reader
from h11._receivebuffer import ReceiveBuffer
from mitmproxy import ctx
from mitmproxy.addons.next_layer import NeedsMoreData
from mitmproxy.connection import ConnectionState
from mitmproxy.net.http import http1
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers import ClientTLSLayer, HttpLayer
from mitmproxy.proxy.layers.http import HTTPMode
from mitmproxy.proxy.layers.http._http1 import TBodyReader, make_body_reader, make_error_response

_HTTP11 = (None, b"http/1.1")
MARK = "lean-layer-spike: serving an intercepted tunnel"


class LeanHttp1(layer.Layer):
    """One client connection, one server connection, one request at a time."""

    def __init__(self, context) -> None:
        super().__init__(context)
        self.cbuf = ReceiveBuffer()
        self.sbuf = ReceiveBuffer()
        self.request = None
        self.response = None
        self.req_reader: TBodyReader | None = None
        self.resp_reader: TBodyReader | None = None
        self.req_chunked = False
        self.resp_chunked = False
        self.waiting = False  # request sent, response not yet complete
        self.closed = False

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        if self.closed:
            return
        if isinstance(event, events.DataReceived):
            if event.connection is self.context.client:
                self.cbuf += event.data
                if not self.waiting:
                    yield from self._client()
            else:
                self.sbuf += event.data
                yield from self._server(eof=False)
        elif isinstance(event, events.ConnectionClosed):
            if event.connection is self.context.server and self.resp_reader is not None:
                yield from self._server(eof=True)
            yield from self._close()
        # events.Start: nothing to do; CommandCompleted is consumed by Layer.handle_event.

    def _close(self) -> layer.CommandGenerator[None]:
        if self.closed:
            return
        self.closed = True
        server = self.context.server
        if server.state is not ConnectionState.CLOSED:
            yield commands.CloseConnection(server)
        if self.context.client.state is not ConnectionState.CLOSED:
            yield commands.CloseConnection(self.context.client)

    def _fail(self, status: int, message: str) -> layer.CommandGenerator[None]:
        if self.context.client.state & ConnectionState.CAN_WRITE:
            yield commands.SendData(self.context.client, make_error_response(status, message))
        yield from self._close()

    @staticmethod
    def _body(read, to, *, chunked: bool) -> Generator[commands.Command, None, bool]:
        """Forward a body's data as `read` (an h11 body reader on its buffer) yields it, re-chunked
        when `chunked`: True at the end of the message, False when it needs more bytes."""
        while True:
            ev = read()
            if ev is None:
                return False
            if not isinstance(ev, Data):
                return True  # EndOfMessage
            data = bytes(ev.data)
            if data:
                yield commands.SendData(to, b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)

    def _client(self) -> layer.CommandGenerator[None]:
        """Parse and forward the client's request (head, then body) as far as the buffer goes."""
        server = self.context.server
        if self.req_reader is None:
            lines = self.cbuf.maybe_extract_lines()
            if lines is None:
                return
            try:
                request = http1.read_request_head([bytes(x) for x in lines])
                size = http1.expected_http_body_size(request)
            except ValueError as e:
                yield from self._fail(400, str(e))
                return
            if request.method.upper() == "CONNECT" or "upgrade" in request.headers:
                yield from self._fail(501, "not in the spike")
                return
            self.request, self.response = request, None
            self.req_chunked = size is None
            self.req_reader = make_body_reader(size)
            if server.state is ConnectionState.CLOSED:
                err = yield commands.OpenConnection(server)
                if err:
                    yield from self._fail(502, f"cannot connect: {err}")
                    return
            yield commands.SendData(server, http1.assemble_request_head(request))
        reader = self.req_reader
        try:
            done = yield from self._body(lambda: reader(self.cbuf), server, chunked=self.req_chunked)
        except ProtocolError as e:
            yield from self._fail(400, f"HTTP/1 protocol error: {e}")
            return
        if not done:
            return
        if self.req_chunked:
            yield commands.SendData(server, b"0\r\n\r\n")
        self.req_reader = None
        self.waiting = True
        if self.sbuf:  # the server answered early
            yield from self._server(eof=False)

    def _server(self, *, eof: bool) -> layer.CommandGenerator[None]:
        """Parse and forward the server's response as far as the buffer goes; then keep-alive."""
        client = self.context.client
        if self.request is None:
            yield from self._close()  # data from the server with no request: not in the spike
            return
        if self.resp_reader is None:
            lines = self.sbuf.maybe_extract_lines()
            if lines is None:
                if eof:
                    yield from self._fail(502, "server closed connection")
                return
            try:
                response = http1.read_response_head([bytes(x) for x in lines])
                size = http1.expected_http_body_size(self.request, response)
            except ValueError as e:
                yield from self._fail(502, f"Cannot parse HTTP response: {e}")
                return
            if response.status_code < 200:
                yield from self._fail(502, "1xx: not in the spike")
                return
            self.response = response
            self.resp_chunked = size is None
            self.resp_reader = make_body_reader(size)
            yield commands.SendData(client, http1.assemble_response_head(response))
        reader = self.resp_reader
        try:
            done = yield from self._body(
                lambda: reader.read_eof() if eof and not self.sbuf else reader(self.sbuf),
                client,
                chunked=self.resp_chunked,
            )
        except ProtocolError:
            yield from self._close()
            return
        if not done:
            return
        # EndOfMessage: the exchange is complete.
        if self.resp_chunked and self.request.method.upper() != "HEAD":
            yield commands.SendData(client, b"0\r\n\r\n")
        request, response = self.request, self.response
        assert response is not None
        until_eof = isinstance(self.resp_reader, Http10Reader)
        self.resp_reader, self.request, self.response, self.waiting = None, None, None, False
        if (
            eof
            or until_eof
            or http1.connection_close(request.http_version, request.headers)
            or http1.connection_close(response.http_version, response.headers)
        ):
            yield from self._close()
            return
        if self.cbuf:  # the client's next request is already here
            yield from self._client()


class LeanLayerSpike:
    """Replace the decrypted HTTP/1 layer of intercepted CONNECT tunnels with LeanHttp1."""

    announced = False

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        if nextlayer.layer is not None:
            return
        context = nextlayer.context
        if not context.layers or not isinstance(context.layers[-1], ClientTLSLayer):
            return  # not inside a decrypted tunnel: mitmproxy decides
        if context.client.alpn not in _HTTP11:
            return  # HTTP/2 and the rest: mitmproxy's HttpLayer
        # Let mitmproxy's NextLayer addon decide first (ignore_hosts, tcp_hosts, rawtcp, ...).
        decider = ctx.master.addons.get("nextlayer")
        try:
            chosen = decider._next_layer(context, nextlayer.data_client(), nextlayer.data_server())
        except NeedsMoreData:  # ask again on the next data
            return
        if isinstance(chosen, HttpLayer) and chosen.mode is HTTPMode.transparent:
            context.layers.remove(chosen)  # Layer.__init__ appended it
            nextlayer.layer = LeanHttp1(context)
            if not self.announced:  # for bench/lean_spike_bench.py's check (mitmdump -q hides logs)
                self.announced = True
                print(MARK, file=sys.stderr, flush=True)
        else:
            nextlayer.layer = chosen


addons = [LeanLayerSpike()]
