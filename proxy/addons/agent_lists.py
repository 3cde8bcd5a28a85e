"""Addon: MCP list answers filtered to what the policy lets an agent use.

A request AgentProtocols allowed under an `mcp:` section whose messages were `tools/list`,
`resources/list` or `prompts/list` calls (`Exchange.lists`) has its answers filtered here: an
entry a call would be refused for is removed (decided by the same function as a call, so
listing and calling agree; `ask` tools stay), in a buffered JSON answer (`response`) or a
streamed one, JSON or server-sent events (`responseheaders`: incrementally, with bounded
memory, byte for byte where nothing is removed). What cannot be read within bounds is
withheld (a JSON-RPC error per list id, or the stream cut), never passed unfiltered. The
credential broker, after this addon, chains its scrubber behind a stream set here.
`notifications/tools/list_changed` needs nothing more: the agent lists again, and that answer
is filtered. The record names what was removed (sandgate.policy.protocols.list_filter).

An event stream a GET opens under an `mcp:` section carries answers to calls made elsewhere:
MCP's older HTTP+SSE transport answers its POSTs there, and a stream resumed with
`Last-Event-ID` replays earlier answers. There, a response is filtered when its result has
exactly a list's shape (`{"tools": [...]}` and paging). Refusals on that transport are
answered on the POST (HTTP 200, JSON-RPC errors), which its clients do not read: a refused
call goes unanswered there, and the session goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

import structlog
from mitmproxy import http

from sandgate.brokers.decoding import StreamDecoder, UndecodableBody, stream_decoder
from sandgate.policy.decision import Mode
from sandgate.policy.protocols.errors import ProtocolError
from sandgate.policy.protocols.json_strict import JsonValue
from sandgate.policy.protocols.list_filter import ListCalls, SseListFilter, filter_list_body
from sandgate.policy.protocols.rules import McpSection
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.agent_protocols import ProtocolBodyRefused
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.limits import declared_length
from sandgate.proxy.addons.protocol_bodies import DEFAULT_BOUNDS, BodyBounds, Unreadable, decoded
from sandgate.proxy.respond import DECISION_HEADER, REASON_HEADER

__all__ = ["LIST_WITHHELD", "AgentListFilter", "withheld_response"]

log = structlog.get_logger("sandgate.agent_lists")

# The record's `error` when a list answer could not be filtered (withheld or cut).
LIST_WITHHELD = "list answer withheld: it could not be filtered"
# JSON-RPC 2.0's "internal error": the server's answer could not be passed on.
INTERNAL_ERROR = -32603
_MAX_REMOVED_NAMES = 50


class AgentListFilter:
    """Filters the answers to MCP list calls AgentProtocols allowed, each read within `bounds`
    (a whole answer, or one server-sent event)."""

    def __init__(self, bounds: BodyBounds = DEFAULT_BOUNDS) -> None:
        self.bounds = bounds

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None or flow.error is not None:
            return
        exchange = Exchange.of(flow)
        calls, exchange.lists = exchange.lists, None
        sse = _media_type(response) == "text/event-stream"
        if calls is None and sse:
            calls = _stream_lists(flow, exchange)
        if calls is None or _bodiless(flow, response):
            return
        try:
            if not sse and not response.stream and _buffered(response, self.bounds.max_body):
                exchange.list_answer = calls  # read whole in `response`
                return
            encoding = (response.headers.get("content-encoding") or "").strip().lower()
            decoder = None
            if encoding not in ("", "identity"):
                decoder = stream_decoder(encoding)
                if decoder is None:
                    _withhold(flow, exchange, "an encoding it cannot decode")
                    flow.kill()
                    return
            response.headers.pop("content-encoding", None)
            response.headers.pop("content-length", None)
            if response.http_version == "HTTP/1.1":
                response.headers["transfer-encoding"] = "chunked"
            # The credential broker, after this addon, chains its scrubber behind this stream.
            if sse:
                response.stream = _sse_stream(flow, exchange, calls, decoder, self.bounds)
            else:
                response.stream = _json_stream(flow, exchange, calls, decoder, self.bounds)
        except Exception:
            log.exception("hook_failed", hook="agent_lists.responseheaders")
            flow.kill()

    def response(self, flow: http.HTTPFlow) -> None:
        exchange = Exchange.of(flow)
        calls, exchange.list_answer = exchange.list_answer, None
        response = flow.response
        if calls is None or response is None or response.stream:
            return
        try:
            raw = response.raw_content or b""
            if not raw:
                return
            data = decoded(raw, response.headers.get("content-encoding"), self.bounds.max_body)
            filtered = filter_list_body(calls, data, self.bounds.json)
            _removed(exchange, filtered.removed)
            if filtered.data is None and data is raw:
                return
            body = data if filtered.data is None else filtered.data
            response.headers.pop("content-encoding", None)
            response.raw_content = body
            response.headers["content-length"] = str(len(body))
        except (Unreadable, ProtocolError) as e:
            _withhold(flow, exchange, str(e))
            flow.response = withheld_response(calls, exchange)
        except Exception:
            log.exception("hook_failed", hook="agent_lists.response")
            _withhold(flow, exchange, "hook failed")
            flow.response = withheld_response(calls, exchange)


def _stream_lists(flow: http.HTTPFlow, exchange: Exchange) -> ListCalls | None:
    """List answers by shape, for an event stream a GET opened under an `mcp:` section (the
    older HTTP+SSE transport answers its POSTs there, and a stream resumed with `Last-Event-ID`
    replays earlier answers): None elsewhere, and in report mode (nothing is enforced)."""
    pending = exchange.pending
    if flow.request.method != "GET" or pending is None:
        return None
    section = pending[1].messages
    if not isinstance(section, McpSection) or pending[1].mode is Mode.REPORT:
        return None
    exchange.extra.setdefault("mcp", {"verdict": "allow", "stream": True})
    return ListCalls(section, (), by_shape=True)


def _bodiless(flow: http.HTTPFlow, response: http.Response) -> bool:
    return response.status_code < 200 or response.status_code in (204, 304) or flow.request.method == "HEAD"


def _media_type(message: http.Message) -> str:
    return (message.headers.get("content-type") or "").partition(";")[0].strip().lower()


def _buffered(response: http.Response, limit: int) -> bool:
    """Whether the `response` hook reads the whole body: a known length within `limit` (the
    bounds' bytes, at most mitmproxy's own bound: a longer or unknown one it would start
    streaming past that bound, unseen)."""
    length = declared_length(response)
    return length is not None and length <= limit


def _content(decoder: StreamDecoder | None, chunk: bytes) -> Iterable[bytes]:
    """A streamed chunk as content (decoded); b"" is the end: what the decoder still held."""
    if decoder is None:
        return (chunk,) if chunk else ()
    return decoder.feed(chunk) if chunk else decoder.finish()


def _sse_stream(
    flow: http.HTTPFlow,
    exchange: Exchange,
    calls: ListCalls,
    decoder: StreamDecoder | None,
    bounds: BodyBounds,
) -> Callable[[bytes], list[bytes]]:
    """A response stream sending an event stream on with its list results filtered (each
    event once complete); raises ProtocolBodyRefused to cut one it cannot read within bounds."""
    events = SseListFilter(calls, max_event=bounds.max_body, limits=bounds.json)

    def stream(chunk: bytes) -> list[bytes]:
        try:
            out = bytearray()
            for piece in _content(decoder, chunk):
                out += events.feed(piece)
            if not chunk:
                out += events.close()
        except (ProtocolError, UndecodableBody) as e:
            _withhold(flow, exchange, str(e))
            raise ProtocolBodyRefused(Reason.UPSTREAM_PROTOCOL_ERROR.value) from None
        finally:
            _removed(exchange, tuple(events.removed))
        return [bytes(out)] if out else []

    return stream


def _json_stream(
    flow: http.HTTPFlow,
    exchange: Exchange,
    calls: ListCalls,
    decoder: StreamDecoder | None,
    bounds: BodyBounds,
) -> Callable[[bytes], list[bytes]]:
    """A response stream holding a JSON answer of unknown (or large) length until it ends, then
    sending it filtered; raises ProtocolBodyRefused to cut one over the bounds or unreadable."""
    held = bytearray()
    limit = bounds.max_body

    def stream(chunk: bytes) -> list[bytes]:
        try:
            for piece in _content(decoder, chunk):
                held.extend(piece)
                if len(held) > limit:
                    raise Unreadable(f"a list answer over the {limit} bytes read to filter it")
            if chunk or not held:
                return []
            body = bytes(held)
            held.clear()
            filtered = filter_list_body(calls, body, bounds.json)
            _removed(exchange, filtered.removed)
            return [body if filtered.data is None else filtered.data]
        except (ProtocolError, UndecodableBody, Unreadable) as e:
            held.clear()
            _withhold(flow, exchange, str(e))
            raise ProtocolBodyRefused(Reason.UPSTREAM_PROTOCOL_ERROR.value) from None

    return stream


def _removed(exchange: Exchange, removed: tuple[tuple[str, str], ...]) -> None:
    """What list filtering removed, in the record's `mcp.removed`: names by list method (tool
    names are not secret, and an operator reading the record needs them), at most
    _MAX_REMOVED_NAMES per method, with the full count."""
    facts = exchange.extra.get("mcp")
    if not removed or not isinstance(facts, dict):
        return
    by_method: dict[str, list[str]] = {}
    for method, name in removed:
        by_method.setdefault(method, []).append(name)
    facts["removed"] = {
        method: {"count": len(names), "names": names[:_MAX_REMOVED_NAMES]}
        for method, names in by_method.items()
    }


def _withhold(flow: http.HTTPFlow, exchange: Exchange, detail: str) -> None:
    """A list answer that cannot be filtered: noted for the record (a fixed text), logged."""
    exchange.failure = LIST_WITHHELD
    pending = exchange.pending
    log.warning(
        "agent_protocols.list_withheld",
        host=flow.request.pretty_host,
        decision_id=pending[0].decision_id if pending is not None else "-",
        detail=detail[:200],
    )


def withheld_response(calls: ListCalls, exchange: Exchange) -> http.Response:
    """The answer to list calls whose upstream answer could not be filtered: a JSON-RPC error
    per list call id (`upstream_protocol_error`) in an HTTP 200, so the session lives on."""
    reason = Reason.UPSTREAM_PROTOCOL_ERROR
    errors: list[JsonValue] = []
    for rpc_id, method in calls.calls:
        data: dict[str, JsonValue] = {
            "reason": str(reason),
            "detail": f"the {method} answer could not be filtered",
        }
        error: dict[str, JsonValue] = {
            "code": INTERNAL_ERROR,
            "message": f"withheld by sandgate: {reason}",
            "data": data,
        }
        errors.append({"jsonrpc": "2.0", "id": rpc_id, "error": error})
    pending = exchange.pending
    headers = {
        REASON_HEADER: str(reason),
        DECISION_HEADER: pending[0].decision_id if pending is not None else "-",
        "Cache-Control": "no-store",
        "Content-Type": "application/json",
    }
    answer: JsonValue = errors[0] if len(errors) == 1 else errors
    return http.Response.make(200, json.dumps(answer).encode(), headers)
