"""HTTP/1 trailers: handed on as mitmproxy's trailers event, never a hung flow, and refused.

mitmproxy 12's HTTP/1 reader raises NotImplementedError when a chunked message ends with
trailer fields: the flow dies inside the proxy and the guest waits ~30 s for nothing.
`patch_http1_trailers()` (called once at start-up) makes the reader hand a response's trailers
on as mitmproxy's trailers event, as its HTTP/2 reader does; a request with trailers from an
HTTP/1 guest is a protocol error before it completes upstream: both connections closed, the
audit record carries the error.
The `Trailers` addon then refuses a response with trailers for an HTTP/1 guest (mitmproxy's
HTTP/1 writer cannot relay them): `502 upstream_unreachable` (the upstream's answer cannot be
relayed; an upstream failure, not a policy denial) and both connections closed; when its body
already streamed to the guest, the guest's connection is cut before the last chunk (an
incomplete message, never a complete one without its trailers). HTTP/2 carries trailers
natively (gRPC): an HTTP/2 guest's trailers pass untouched, and its reader is not touched.
"""

from __future__ import annotations

import h11
import structlog
from mitmproxy import http
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import ErrorCode, RequestProtocolError, ResponseTrailers
from mitmproxy.version import VERSION

from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.mitm.closer import ConnectionCloser
from sandgate.proxy.respond import upstream_error_response

__all__ = ["TRAILERS_REFUSED", "Trailers", "patch_http1_trailers"]

log = structlog.get_logger("sandgate.trailers")

# The reader below restates mitmproxy's own for exactly this release (pinned in pyproject).
_PATCHED_RELEASE = "12.3."
TRAILERS_REFUSED = "HTTP/1 trailers cannot be relayed"


def _read_body(self: _http1.Http1Connection, event: events.Event) -> layer.CommandGenerator[None]:
    """mitmproxy 12.3's Http1Connection.read_body, with trailers passed on instead of raising."""
    assert self.stream_id is not None
    while True:
        try:
            if isinstance(event, events.DataReceived):
                h11_event = self.body_reader(self.buf)
            elif isinstance(event, events.ConnectionClosed):
                h11_event = self.body_reader.read_eof()
            else:
                raise AssertionError(f"Unexpected event: {event}")
        except h11.ProtocolError as e:
            yield commands.CloseConnection(self.conn)
            yield ReceiveHttp(
                self.ReceiveProtocolError(
                    self.stream_id, f"HTTP/1 protocol error: {e}", code=self.ReceiveProtocolError.code
                )
            )
            return
        if h11_event is None:
            return
        if isinstance(h11_event, h11.Data):
            data = bytes(h11_event.data)
            if data:
                yield ReceiveHttp(self.ReceiveData(self.stream_id, data))
        elif isinstance(h11_event, h11.EndOfMessage):
            assert self.request
            is_request = isinstance(self, _http1.Http1Server)
            if h11_event.headers and is_request:
                # Before the end of the message: mitmproxy closes a streaming upstream unfinished.
                yield commands.CloseConnection(self.conn)
                yield ReceiveHttp(
                    RequestProtocolError(
                        self.stream_id, TRAILERS_REFUSED, code=ErrorCode.GENERIC_CLIENT_ERROR
                    )
                )
                self.state = self.done
                return
            if h11_event.headers:
                trailers = http.Headers(list(h11_event.headers.raw_items()))
                yield ReceiveHttp(ResponseTrailers(self.stream_id, trailers))
            if self.request.data.method.upper() != b"CONNECT":
                yield ReceiveHttp(self.ReceiveEndOfMessage(self.stream_id))
            yield from self.mark_done(request=is_request, response=not is_request)
            return


def patch_http1_trailers() -> None:
    """Install the reader above; refuses (RuntimeError) on a mitmproxy it was not written for."""
    if not VERSION.startswith(_PATCHED_RELEASE):
        raise RuntimeError(
            f"sandgate's HTTP/1 trailers fix is for mitmproxy {_PATCHED_RELEASE}x, not {VERSION}"
        )
    _http1.Http1Connection.read_body = _read_body  # type: ignore[method-assign]


class Trailers:
    """Refuses HTTP/1 messages with trailers that mitmproxy's HTTP/1 writer cannot relay."""

    def __init__(self, closer: ConnectionCloser) -> None:
        self.closer = closer

    def response(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None or not response.trailers or not flow.request.http_version.startswith("HTTP/1"):
            return
        # Runs before AuditCompletion's `response`, which records the exchange with this failure.
        log.warning("trailers.refused", side="response", host=flow.request.pretty_host)
        exchange = Exchange.of(flow)
        exchange.failure = TRAILERS_REFUSED
        if response.stream:
            # Head and body are on their way to the guest: cut before the final chunk.
            if flow.killable:
                flow.kill()
            self.closer.close(flow.client_conn, flow.server_conn)
            return
        pending = exchange.pending
        decision_id = pending[0].decision_id if pending is not None else "-"
        refusal = upstream_error_response(Reason.UPSTREAM_UNREACHABLE, flow.request.pretty_host, decision_id)
        refusal.headers["Connection"] = "close"
        flow.response = refusal
        self.closer.close(flow.client_conn, flow.server_conn, keep_client=True)
