"""Caps on HTTP/1 heads and on the time to read one: enforced inside mitmproxy's HTTP/1 layer
(`install`), declared and audited by the `HeadGuard` addon.

mitmproxy 12.3's HTTP/1 reader appends every received byte to a buffer until it sees the
blank line that ends a head, with no cap ("FIXME: protect against header size DoS" in
`_http1.py`): one connection sending 1.5 GiB of headers grew the gateway to 6.3 GiB.
Nothing in its options bounds it, so `install()` wraps the one method all HTTP/1 bytes go
through, `Http1Connection._handle_event`, and checks each chunk BEFORE it is buffered:

- a request head over `max_bytes` or `max_lines` → 431 `header_too_large`, closed;
- pipelined bytes over `max_bytes` while a response is pending → closed;
- a request head not complete `timeout` seconds after its first byte (the first request
  of a connection or tunnel: after the HTTP layer started) → 408 `header_timeout`, closed;
- a response head over a cap → the upstream connection is closed and the guest gets 502
  `header_too_large` (a `RefusedResponse` HeadGuard completes and audits).

HTTP/2 (intercepted tunnels) is bounded by the h2 library itself (a decoded header list
over its limit, more than 64 CONTINUATION frames: a connection error, GOAWAY); the wrapper
of `Http2Connection` sets that limit to `max_bytes`, advertises it in SETTINGS
(MAX_HEADER_LIST_SIZE), and reports a guest's oversized header block like an HTTP/1 one.

Refusals of request heads are reported to addons by the `sandgate_head_refused` hook (no
flow exists yet). The wrapper acts only where the master declares the `sandgate_head_*`
options (HeadGuard's), so a master without that addon is left as mitmproxy made it.
mitmproxy's layer internals are not an API: `self_test()` checks the seam at start-up and
refuses to run when it moved (pinned to 12.3.x in pyproject.toml).

HeadGuard declares the caps (mitmproxy options the wrapper reads) and writes the one record of
each refusal: a refused request head has no flow (the layer reports it through the
`sandgate_head_refused` hook; the record names what the connection has established), and a
refused response head is the request's denial (`header_too_large`) on its exchange. It comes
before the request gate in the chain, so the refused response is recorded once, there.
"""

from __future__ import annotations

import re
import time
import weakref
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Any

import h2.connection
import h2.events
import h2.exceptions
import structlog
from h11._receivebuffer import ReceiveBuffer
from mitmproxy import connection, http, optmanager, version
from mitmproxy.net.http import http1
from mitmproxy.options import Options
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.http import _http1, _http2
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import (
    RequestData,
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
)

from sandgate.policy.decision import Decision, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.exchange import Exchange, exchange_context
from sandgate.proxy.audit.records import decision_record, new_decision_id
from sandgate.proxy.config import HeadsConfig
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.respond import DECISION_HEADER, REASON_HEADER, json_body

__all__ = [
    "HeadGuard",
    "HeadLimits",
    "HeadRefusal",
    "RefusedResponse",
    "SandgateHeadRefusedHook",
    "head_limits",
    "head_overflow",
    "install",
    "refused_response",
    "request_head_refusal",
    "self_test",
]

log = structlog.get_logger("sandgate.heads")

OPT_MAX_BYTES = "sandgate_head_max_bytes"
OPT_MAX_LINES = "sandgate_head_max_lines"
OPT_TIMEOUT = "sandgate_head_timeout"

# h11's end of a head: an empty line, CRLF or bare LF (h11._receivebuffer).
_BLANK_LINE = re.compile(b"\n\r?\n", re.MULTILINE)

Commands = Generator[commands.Command, Any, None]


@dataclass(frozen=True, slots=True)
class HeadLimits:
    max_bytes: int
    max_lines: int
    timeout: float


@dataclass(frozen=True, slots=True)
class HeadRefusal:
    """A request head the gateway refused before any flow existed."""

    client: connection.Client
    reason: Reason
    status: int | None  # None: closed without an answer (a response was still pending)
    decision_id: str
    detail: str


@dataclass
class SandgateHeadRefusedHook(commands.StartHook):
    """A request head was refused (431 or 408) and its connection closed."""

    refusal: HeadRefusal
    # Nothing waits for the audit record: the refusal is already sent.
    blocking = False


class RefusedResponse(http.Response):
    """The 502 that replaces a response head over the cap; only the gateway makes these."""

    limit: str = "max_bytes"


def head_overflow(buffered: bytes, data: bytes, total: int, limits: HeadLimits) -> str | None:
    """Which cap (`max_bytes`, `max_lines`) the head being read breaks, or None.

    `buffered` is what is held already, `data` the new chunk, `total` their length. Leading
    empty lines (which h11 drops one per read) count toward the size. Only the first
    `max_bytes` + 4 bytes are looked at: a head must end within them.
    """
    window = (buffered + data[: max(0, limits.max_bytes + 4 - len(buffered))])[: limits.max_bytes + 4]
    start = len(window) - len(window.lstrip(b"\r\n"))
    end = _BLANK_LINE.search(window, start) if start < len(window) else None
    if end is not None and end.end() <= limits.max_bytes:
        lines = window.count(b"\n", start, end.start() + 1)
    elif total > limits.max_bytes:
        return "max_bytes"
    else:
        lines = window.count(b"\n", start)
    return "max_lines" if lines > limits.max_lines else None


@dataclass(slots=True)
class _Watch:
    """Per HTTP/1 layer: when the head being read started, the pending wakeup, the refusal."""

    head_since: float | None = None
    first: bool = True
    wakeup: commands.RequestWakeup | None = None
    refused: bool = False


_WATCHES: weakref.WeakKeyDictionary[_http1.Http1Connection, _Watch] = weakref.WeakKeyDictionary()
_ORIGINAL: Callable[..., Commands] | None = None


_LIMITS: dict[tuple[Any, ...], HeadLimits] = {}  # read on every HTTP/1 event: built once


def head_limits(options: Options) -> HeadLimits | None:
    """The caps in force (the master's `sandgate_head_*` options), or None: none declared."""
    return _limits(options)


def _limits(options: Options) -> HeadLimits | None:
    """The master's caps, or None when no HeadGuard declared them (leave mitmproxy alone).

    Read from the option objects' slots (value, default), not through `Options.__getattr__`:
    three attribute reads through it cost more than the rest of a small event's check."""
    table = options._options
    max_bytes = table.get(OPT_MAX_BYTES)
    max_lines = table.get(OPT_MAX_LINES)
    timeout = table.get(OPT_TIMEOUT)
    if max_bytes is None or max_lines is None or timeout is None:
        return None
    unset = optmanager.unset
    key = (
        max_bytes._default if max_bytes.value is unset else max_bytes.value,
        max_lines._default if max_lines.value is unset else max_lines.value,
        timeout._default if timeout.value is unset else timeout.value,
    )
    limits = _LIMITS.get(key)
    if limits is None:
        if len(_LIMITS) > 64:
            _LIMITS.clear()
        limits = _LIMITS[key] = HeadLimits(int(key[0]), int(key[1]), float(key[2]))
    return limits


def install() -> None:
    """Wrap mitmproxy's HTTP/1 event handler once per process (idempotent)."""
    global _ORIGINAL
    if _ORIGINAL is not None:
        return
    original = _http1.Http1Connection._handle_event
    _ORIGINAL = original

    def _handle_event(self: _http1.Http1Connection, event: events.Event) -> Commands:
        if _body_bytes(self, event):
            # A body or a tunnel, chunk by chunk: no head to cap, nothing to watch.
            yield from original(self, event)
            return
        limits = _limits(self.context.options)
        if limits is None:
            yield from original(self, event)
            return
        yield from _guarded(self, event, limits, original)

    _http1.Http1Connection._handle_event = _handle_event  # type: ignore[method-assign]
    _install_h2()


def _install_h2() -> None:
    """Set h2's header-list cap from the options, and report a guest's oversized block."""
    on_event = _http2.Http2Connection._handle_event
    on_h2_event = _http2.Http2Connection.handle_h2_event

    def _handle_event(self: _http2.Http2Connection, event: events.Event) -> Commands:
        # The caps are read on Start only: this runs for every frame of a body.
        limits = _limits(self.context.options) if isinstance(event, events.Start) else None
        if limits is not None:
            _cap_header_list(self.h2_conn, limits.max_bytes)
        yield from on_event(self, event)

    def handle_h2_event(self: _http2.Http2Connection, event: h2.events.Event) -> Generator[Any, Any, bool]:
        oversized = (
            isinstance(event, h2.exceptions.ProtocolError)
            and isinstance(self, _http2.Http2Server)
            and _oversized_block(event)
        )
        limits = _limits(self.context.options) if oversized else None
        if limits is not None:
            refusal = HeadRefusal(
                self.context.client,
                Reason.HEADER_TOO_LARGE,
                None,
                new_decision_id(),
                f"HTTP/2 header block over {limits.max_bytes} bytes or 64 frames (GOAWAY)",
            )
            yield SandgateHeadRefusedHook(refusal)
        stop: bool = yield from on_h2_event(self, event)
        return stop

    _http2.Http2Connection._handle_event = _handle_event  # type: ignore[method-assign]
    _http2.Http2Connection.handle_h2_event = handle_h2_event  # type: ignore[method-assign]


_BYTES = frozenset({events.DataReceived, RequestData, ResponseData})


def _body_bytes(layer: _http1.Http1Connection, event: events.Event) -> bool:
    """Bytes of a body or a tunnel (a CONNECT's, once piped) for which `_guarded` would do
    nothing: no head is read in these states, and a refused layer never reaches them (a
    refusal ends in `done`, and only a head read through `_guarded` leads to `read_body`,
    `wait` or `passthrough`, after which its `_track_head` has cleared the watch)."""
    kind = type(event)
    if kind not in _BYTES:
        return False
    state = layer.state
    if state == layer.passthrough:
        return True
    if kind is events.DataReceived:
        return state == layer.read_body and isinstance(layer, _http1.Http1Client)
    return kind is ResponseData and state == layer.wait and isinstance(layer, _http1.Http1Server)


def _cap_header_list(conn: h2.connection.H2Connection, max_bytes: int) -> None:
    """Advertise and enforce the cap before our SETTINGS go out (they go out on Start)."""
    conn.local_settings.max_header_list_size = max_bytes
    conn.local_settings.acknowledge()  # sent as current in the connection preamble
    conn.decoder.max_header_list_size = max_bytes


def _oversized_block(error: h2.exceptions.ProtocolError) -> bool:
    """Whether h2 refused a header block for its size (decoded, or in CONTINUATION frames)."""
    return isinstance(error, h2.exceptions.DenialOfServiceError) or "continuation frames" in str(error)


def _guarded(
    layer: _http1.Http1Connection,
    event: events.Event,
    limits: HeadLimits,
    original: Callable[..., Commands],
) -> Commands:
    watch = _WATCHES.get(layer)
    if watch is None:
        watch = _WATCHES[layer] = _Watch()
    if watch.refused:
        return  # closing: nothing more is read or answered
    if isinstance(event, events.Wakeup) and event.command is watch.wakeup:
        watch.wakeup = None
        yield from _on_wakeup(layer, watch, limits)
        return
    if isinstance(event, events.DataReceived):
        problem = _check_data(layer, event.data, limits)
        if problem is not None:
            yield from _refuse(layer, watch, problem, limits, len(event.data))
            return
    yield from original(layer, event)
    if isinstance(layer, _http1.Http1Server) and not watch.refused:
        if layer.state == layer.read_headers and len(layer.buf) > 0:
            # A pipelined head that waited in the buffer is now the one being read.
            problem = head_overflow(bytes(layer.buf), b"", len(layer.buf), limits)
            if problem is not None:
                yield from _refuse(layer, watch, problem, limits)
                return
        yield from _track_head(layer, watch, limits)


def _check_data(layer: _http1.Http1Connection, data: bytes, limits: HeadLimits) -> str | None:
    """The cap this chunk breaks in a state that buffers a head, or None."""
    state = layer.state
    if state == layer.read_headers:
        if isinstance(layer, _http1.Http1Client) and (layer.request is None or layer.stream_id is None):
            return None  # mitmproxy closes on data for no request
        return head_overflow(bytes(layer.buf), data, len(layer.buf) + len(data), limits)
    if isinstance(layer, _http1.Http1Server) and state == layer.wait:
        # The next (pipelined) request waits in the buffer until this response is sent.
        return "pipelined" if len(layer.buf) + len(data) > limits.max_bytes else None
    return None


def _track_head(layer: _http1.Http1Server, watch: _Watch, limits: HeadLimits) -> Commands:
    """Start the clock when a head starts (or the layer does), stop it when the head is read."""
    if layer.state != layer.read_headers:
        watch.head_since = None
        watch.first = False
        return
    if watch.head_since is None and (watch.first or len(layer.buf) > 0):
        watch.head_since = time.monotonic()
    if watch.head_since is not None and watch.wakeup is None:
        watch.wakeup = commands.RequestWakeup(max(0.0, watch.head_since + limits.timeout - time.monotonic()))
        yield watch.wakeup


def _on_wakeup(layer: _http1.Http1Connection, watch: _Watch, limits: HeadLimits) -> Commands:
    if watch.head_since is None or layer.state != layer.read_headers:
        return  # the head was read in time; a later one re-arms
    remaining = watch.head_since + limits.timeout - time.monotonic()
    if remaining > 0.01:
        watch.wakeup = commands.RequestWakeup(remaining)
        yield watch.wakeup
        return
    yield from _refuse(layer, watch, "timeout", limits)


def _refuse(
    layer: _http1.Http1Connection, watch: _Watch, problem: str, limits: HeadLimits, unbuffered: int = 0
) -> Commands:
    watch.refused = True
    received = len(layer.buf) + unbuffered
    layer.buf = ReceiveBuffer()  # give the memory back now
    layer.state = layer.done
    if isinstance(layer, _http1.Http1Client):
        # A response head over the cap: the upstream goes; the stream gets a 502 to send.
        yield commands.CloseConnection(layer.conn)
        assert layer.stream_id is not None
        response = refused_response(502, Reason.HEADER_TOO_LARGE, None, problem)
        yield ReceiveHttp(ResponseHeaders(layer.stream_id, response, end_stream=True))
        yield ReceiveHttp(ResponseEndOfMessage(layer.stream_id))
        return
    yield from request_head_refusal(layer.context.client, problem, limits, received)


def request_head_refusal(
    client: connection.Client, problem: str, limits: HeadLimits, received: int
) -> Commands:
    """A refused request head (`problem`: a cap's name, "timeout" or "pipelined"): its hook (the
    record), the answer (none for "pipelined": a response is still being sent), the close."""
    reason = Reason.HEADER_TIMEOUT if problem == "timeout" else Reason.HEADER_TOO_LARGE
    status: int | None = 408 if problem == "timeout" else 431
    if problem == "pipelined":
        status = None  # a response is still being sent: no room for another answer
    decision_id = new_decision_id()
    detail = _detail(problem, limits, received)
    yield SandgateHeadRefusedHook(HeadRefusal(client, reason, status, decision_id, detail))
    if status is not None:
        response = refused_response(status, reason, decision_id, _limit_name(problem))
        yield commands.SendData(client, http1.assemble_response(response))
    yield commands.CloseConnection(client)


def _limit_name(problem: str) -> str:
    return {"timeout": "read_timeout_seconds", "pipelined": "max_bytes"}.get(problem, problem)


def _detail(problem: str, limits: HeadLimits, received: int) -> str:
    if problem == "timeout":
        return f"request head not complete after {limits.timeout:g} s ({received} bytes read)"
    if problem == "max_lines":
        return f"request head over {limits.max_lines} lines"
    if problem == "pipelined":
        return f"over {limits.max_bytes} bytes pipelined while a response was pending"
    return f"request head over {limits.max_bytes} bytes"


def refused_response(status: int, reason: Reason, decision_id: str | None, limit: str) -> RefusedResponse:
    """The gateway's answer to a refused head, shaped like its denials; the connection closes."""
    fields = {"error": "egress denied", "reason": reason.value, "host": None, "decision_id": decision_id}
    fields["limit"] = limit
    headers = {
        "Content-Type": "application/json",
        REASON_HEADER: reason.value,
        "Cache-Control": "no-store",
        "Connection": "close",
    }
    if decision_id is not None:
        headers[DECISION_HEADER] = decision_id
    response = RefusedResponse.make(status, json_body(fields), headers)
    assert isinstance(response, RefusedResponse)
    response.limit = limit
    return response


def self_test(options: Options) -> None:
    """Feed an over-long head through the wrapped layer; RuntimeError when the seam moved."""
    if not version.VERSION.startswith("12.3."):
        raise RuntimeError(f"sandgate's head caps are written for mitmproxy 12.3.x, found {version.VERSION}")
    limits = _limits(options)
    if _ORIGINAL is None or limits is None:
        raise RuntimeError("head caps not installed (sandgate.proxy.addons.heads.install, HeadGuard addon)")
    client = connection.Client(peername=("127.0.0.1", 1), sockname=("127.0.0.1", 2))
    layer = _http1.Http1Server(Context(client, options))
    sent: list[commands.Command] = []
    try:
        sent += layer.handle_event(events.Start())
        head = b"GET / HTTP/1.1\r\nX: " + b"a" * limits.max_bytes
        sent += layer.handle_event(events.DataReceived(client, head))
    except Exception as e:
        raise RuntimeError(f"mitmproxy's HTTP/1 layer changed under sandgate's head caps: {e!r}") from e
    answered = any(
        isinstance(c, commands.SendData) and c.data.startswith(b"HTTP/1.1 431 ") for c in sent
    ) and any(isinstance(c, commands.CloseConnection) for c in sent)
    if not answered or len(layer.buf) != 0:
        raise RuntimeError("mitmproxy's HTTP/1 layer changed: an over-long request head was not refused")


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
            dctx = exchange_context(state, refusal.client, Phase.REQUEST)
            dctx = replace(dctx, sni=state.sni if state else None, decision_id=refusal.decision_id)
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
            exchange = Exchange.of(flow)
            pending = exchange.pending
            if pending is None:
                # Not decided by the request gate (cannot happen for an upstream answer): refused.
                flow.response = refused_response(502, Reason.HEADER_TOO_LARGE, None, limit)
                return
            dctx, allowed = pending
            cfg = self.config
            cap = f"{cfg.max_lines} lines" if limit == "max_lines" else f"{cfg.max_bytes} bytes"
            detail = f"response head over {cap}"
            decision = allowed.as_denial(Reason.HEADER_TOO_LARGE, detail)
            response = refused_response(502, Reason.HEADER_TOO_LARGE, dctx.decision_id, limit)
            bytes_up = exchange.head_bytes + len(flow.request.raw_content or b"")
            await exchange.refuse(self.ctx.audit, flow, response, decision, status=502, bytes_up=bytes_up)
        except Exception:
            log.exception("hook_failed", hook="response")
            flow.response = refused_response(502, Reason.HEADER_TOO_LARGE, None, "max_bytes")
