"""WebSocket sessions inside mitmproxy's layer: a cap on one message, control frames shown to
addons, and a clean close an addon can ask for.

mitmproxy 12.3's `WebsocketLayer.relay_messages` (layers/websocket.py) relays PING and PONG
payloads and CLOSE reasons with no hook (a placeholder in one reached the upstream; it also
logs ping payloads), assembles each message whole with no cap (a 40 MiB message grew a worker
by 62 MiB that it kept: a frame's pieces are concatenated one by one, and the last message
stays on the flow), inflates permessage-deflate frames without a bound, and gives addons no
way to end a session with a close code. `install()` replaces it with a restatement for 12.3
that:

- counts each message's bytes (inflated) as its fragments arrive and, past
  `sandgate_websocket_max_message_bytes`, drops what it holds and ends the session: 1009
  (Message Too Big) to the side that sent it, 1001 (Going Away) to the other; addons hear of
  it through the non-blocking `sandgate_websocket_oversize` hook (one audit record);
- inflates at most the cap in one step, so a small deflated frame cannot expand past it;
- shows every PING, PONG and CLOSE to addons through the blocking `sandgate_websocket_control`
  hook before relaying it: an addon may rewrite its payload (scrub) or refuse it;
- ends the session when an addon asked during a message or control hook (`request_close`):
  a CLOSE frame with the code and reason each side gets, then both connections closed;
- answers a guest message an addon dropped with the text message it asked for
  (`request_answer`: a JSON-RPC error for a refused call), sent to the guest alone, whole,
  between the messages the upstream sends (the session goes on);
- keeps no relayed message on the flow (mitmproxy keeps them all, for its UI).

The cap applies where the master declares the option (the Upgrades addon does); elsewhere
messages are uncapped, as in mitmproxy. mitmproxy's layer internals are not an API:
`self_test()` checks the seam at start-up and refuses to run when it moved.
"""

from __future__ import annotations

import time
import weakref
import zlib
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Literal

import wsproto.events
from mitmproxy import connection, http, optmanager, version, websocket
from mitmproxy.options import Options
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers import websocket as layers
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.extensions import Extension, PerMessageDeflate
from wsproto.frame_protocol import CloseReason, FrameDecoder, FrameProtocol, Opcode

from sandgate.policy.reasons import Reason
from sandgate.proxy.audit.records import new_decision_id

__all__ = [
    "CLOSE_REASON_MAX",
    "CONTROL_PAYLOAD_MAX",
    "OPT_MAX_MESSAGE",
    "OversizedMessage",
    "SandgateWebsocketControlHook",
    "SandgateWebsocketOversizeHook",
    "SessionClose",
    "WebSocketControl",
    "close_reason",
    "install",
    "request_answer",
    "request_close",
    "self_test",
]

OPT_MAX_MESSAGE = "sandgate_websocket_max_message_bytes"
# RFC 6455 5.5: a control frame's payload; a CLOSE's reason is what is left after its code.
CONTROL_PAYLOAD_MAX = 125
CLOSE_REASON_MAX = 123
_CLOSE_KEY = "sandgate.websocket.close"
_ANSWER_KEY = "sandgate.websocket.answer"
_PATCHED_RELEASE = "12.3."

Commands = Generator[commands.Command, Any, None]
ControlKind = Literal["ping", "pong", "close"]


@dataclass(frozen=True, slots=True)
class SessionClose:
    """How the gateway ends a session: the close code and reason each side gets, and whose
    frame ended it (`flow.websocket.closed_by_client`)."""

    guest_code: int
    guest_reason: str
    upstream_code: int
    upstream_reason: str = ""
    by_guest: bool = True


@dataclass(slots=True)
class WebSocketControl:
    """A PING, PONG or CLOSE on its way to the other side. `payload` is what that side gets
    (a CLOSE's reason as UTF-8); a handler may replace it, within `CONTROL_PAYLOAD_MAX` bytes."""

    flow: http.HTTPFlow
    from_client: bool
    kind: ControlKind
    payload: bytes
    code: int | None = None  # a CLOSE's code


@dataclass(frozen=True, slots=True)
class OversizedMessage:
    """A message the layer refused for its size; its session is closed already."""

    flow: http.HTTPFlow
    from_client: bool
    limit: int
    received: int  # bytes of the message when it was refused (more than `limit`)
    decision_id: str


@dataclass
class SandgateWebsocketControlHook(commands.StartHook):
    """A PING, PONG or CLOSE arrived; it is relayed (as the handlers left it) after this hook.
    (mitmproxy's proxy server passes hooks one argument: the flow travels inside it.)"""

    control: WebSocketControl


@dataclass
class SandgateWebsocketOversizeHook(commands.StartHook):
    """A message passed the cap: the session was ended (1009 to its sender)."""

    oversized: OversizedMessage
    # Nothing waits for the audit record: the session is closed either way.
    blocking = False


def close_reason(reason: Reason, decision_id: str) -> str:
    """The CLOSE reason the guest reads (well under CLOSE_REASON_MAX): the code and the record."""
    return f"sandgate: {reason.value} (decision {decision_id})"


def request_close(flow: http.HTTPFlow, close: SessionClose) -> bool:
    """Ask the layer to end `flow`'s session once the running hook returns (the message or
    control frame at hand is not relayed); False when no layer will (the seam is not
    installed): the caller must close the connections itself."""
    flow.metadata[_CLOSE_KEY] = close
    return _ORIGINAL is not None


def request_answer(flow: http.HTTPFlow, text: str) -> bool:
    """Answer the guest message at hand, which the running message hook drops, with one text
    message to the guest (the upstream gets nothing); False when no layer will (the seam is
    not installed): the caller must end the session instead."""
    flow.metadata[_ANSWER_KEY] = text
    return _ORIGINAL is not None


# -- per-layer state ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Assembly:
    """One direction's message in the making: its finished frames, the current frame's pieces."""

    frames: list[bytes] = field(default_factory=list)
    pieces: list[bytes] = field(default_factory=list)
    size: int = 0

    def add(self, chunk: bytes, frame_finished: bool) -> None:
        # Pieces are joined once per frame: mitmproxy's `+=` per piece copies quadratically.
        self.pieces.append(chunk)
        self.size += len(chunk)
        if frame_finished:
            self.frames.append(b"".join(self.pieces))
            self.pieces = []

    def take(self) -> list[bytes]:
        """The message's frames (it is complete); the assembly starts over."""
        frames = self.frames
        self.clear()
        return frames

    def clear(self) -> None:
        self.frames, self.pieces, self.size = [], [], 0


@dataclass(slots=True)
class _State:
    limit: int | None
    guest: _Assembly = field(default_factory=_Assembly)
    upstream: _Assembly = field(default_factory=_Assembly)
    ended: bool = False


_STATES: weakref.WeakKeyDictionary[layers.WebsocketLayer, _State] = weakref.WeakKeyDictionary()
_ORIGINAL: Callable[..., Commands] | None = None


def _limit(options: Options) -> int | None:
    """The master's cap, or None where no addon declared it."""
    option = options._options.get(OPT_MAX_MESSAGE)
    if option is None:
        return None
    value = option._default if option.value is optmanager.unset else option.value
    return int(value)


def _state(layer: layers.WebsocketLayer) -> _State:
    state = _STATES.get(layer)
    if state is None:
        state = _STATES[layer] = _State(_limit(layer.context.options))
        if state.limit is not None:
            for ws in (layer.client_ws, layer.server_ws):
                _cap_inflation(ws._proto, state.limit)
    return state


class _CappedDeflate(PerMessageDeflate):
    """permessage-deflate that inflates at most `max_output` bytes per step: a frame that
    would inflate to more is a message over the cap (1009) before its bytes are made.
    wsproto 1.3's `frame_inbound_payload_data`, with zlib's `max_length`."""

    max_output = 0

    def frame_inbound_payload_data(
        self, proto: FrameDecoder | FrameProtocol, data: bytes
    ) -> bytes | CloseReason:
        if not self._inbound_compressed or not self._inbound_is_compressible:
            return data
        assert self._decompressor is not None
        try:
            out = self._decompressor.decompress(bytes(data), self.max_output)
        except zlib.error:
            return CloseReason.INVALID_FRAME_PAYLOAD_DATA
        if len(out) >= self.max_output or self._decompressor.unconsumed_tail:
            return CloseReason.MESSAGE_TOO_BIG
        return out


def _cap_inflation(proto: FrameProtocol, limit: int) -> None:
    """Swap the connection's deflate extension for the capped one (same object, same state)."""
    extensions: list[Extension] = proto.extensions
    for ext in extensions:
        if type(ext) is PerMessageDeflate:
            ext.__class__ = _CappedDeflate
            assert isinstance(ext, _CappedDeflate)
            ext.max_output = limit + 1


def _asked_close(flow: http.HTTPFlow) -> SessionClose | None:
    close = flow.metadata.pop(_CLOSE_KEY, None)
    return close if isinstance(close, SessionClose) else None


# -- the relay ---------------------------------------------------------------------------------

_RELAYED = (events.DataReceived, events.ConnectionClosed, layers.WebSocketMessageInjected)


def _relay_messages(self: layers.WebsocketLayer, event: events.Event) -> Commands:
    """mitmproxy 12.3's `WebsocketLayer.relay_messages`, changed as the module docstring says."""
    if not isinstance(event, _RELAYED):
        raise AssertionError(f"Unexpected event type at relay_messages: {event}")
    assert self.flow.websocket  # satisfy type checker
    state = _state(self)
    if isinstance(event, events.ConnectionEvent):
        from_client = event.connection == self.context.client
        injected = False
    else:
        from_client, injected = event.message.from_client, True
    src_ws = self.client_ws if from_client else self.server_ws
    if isinstance(event, events.DataReceived):
        src_ws.receive_data(event.data)
    elif isinstance(event, events.ConnectionClosed):
        src_ws.receive_data(None)
    else:
        fragmentizer = layers.Fragmentizer([], event.message.type == Opcode.TEXT)
        src_ws._events.extend(fragmentizer(event.message.content))
    for ws_event in src_ws.events():
        if isinstance(ws_event, wsproto.events.Message):
            yield from _on_data(self, state, ws_event, from_client, injected)
        elif isinstance(ws_event, wsproto.events.Ping | wsproto.events.Pong):
            yield from _on_ping_pong(self, state, ws_event, from_client)
        elif isinstance(ws_event, wsproto.events.CloseConnection):
            yield from _on_close(self, state, ws_event, from_client)
        else:  # pragma: no cover
            raise AssertionError(f"Unexpected WebSocket event: {ws_event}")
        if state.ended:
            return


def _on_data(
    layer: layers.WebsocketLayer,
    state: _State,
    ws_event: wsproto.events.Message[Any],
    from_client: bool,
    injected: bool,
) -> Commands:
    is_text = isinstance(ws_event.data, str)
    chunk = ws_event.data.encode() if is_text else bytes(ws_event.data)
    assembly = state.guest if from_client else state.upstream
    if state.limit is not None and assembly.size + len(chunk) > state.limit:
        yield from _refuse_oversize(layer, state, from_client, assembly.size + len(chunk))
        return
    assembly.add(chunk, ws_event.frame_finished or ws_event.message_finished)
    if not ws_event.message_finished:
        return
    frames = assembly.take()
    fragmentizer = layers.Fragmentizer(frames, is_text)  # keeps the frames' lengths only
    typ = Opcode.TEXT if is_text else Opcode.BINARY
    message = websocket.WebSocketMessage(typ, from_client, b"".join(frames), injected=injected)
    del frames  # a message's bytes are held once from here on
    flow = layer.flow
    assert flow.websocket is not None
    flow.websocket.messages.append(message)
    yield layers.WebsocketMessageHook(flow)
    answer = flow.metadata.pop(_ANSWER_KEY, None)
    close = _asked_close(flow)
    if close is not None:
        yield from _end(layer, state, close)
        return
    if not message.dropped:
        dst_ws = layer.server_ws if from_client else layer.client_ws
        for msg in fragmentizer(message.content):
            yield dst_ws.send2(msg)
    elif from_client and isinstance(answer, str):
        # Whole, to the guest: upstream messages reach it only once they are whole too.
        yield layer.client_ws.send2(wsproto.events.TextMessage(answer))
    flow.websocket.messages.clear()


def _on_ping_pong(
    layer: layers.WebsocketLayer,
    state: _State,
    ws_event: wsproto.events.Ping | wsproto.events.Pong,
    from_client: bool,
) -> Commands:
    # Not logged as mitmproxy did: a payload can carry a placeholder or a secret.
    is_ping = isinstance(ws_event, wsproto.events.Ping)
    control = WebSocketControl(
        layer.flow, from_client, "ping" if is_ping else "pong", bytes(ws_event.payload)
    )
    yield SandgateWebsocketControlHook(control)
    close = _asked_close(layer.flow)
    if close is None and len(control.payload) > CONTROL_PAYLOAD_MAX:
        close = _fault(from_client)  # a rewrite no control frame can carry
    if close is not None:
        yield from _end(layer, state, close)
        return
    dst_ws = layer.server_ws if from_client else layer.client_ws
    relayed = wsproto.events.Ping(control.payload) if is_ping else wsproto.events.Pong(control.payload)
    yield dst_ws.send2(relayed)


def _on_close(
    layer: layers.WebsocketLayer,
    state: _State,
    ws_event: wsproto.events.CloseConnection,
    from_client: bool,
) -> Commands:
    src_ws = layer.client_ws if from_client else layer.server_ws
    if (
        ws_event.code == CloseReason.MESSAGE_TOO_BIG
        and src_ws.state is ConnectionState.OPEN
        and state.limit is not None
    ):
        # Not the peer's CLOSE (receiving one leaves it REMOTE_CLOSING): the capped inflater's.
        yield from _refuse_oversize(layer, state, from_client, state.limit + 1)
        return
    own = ws_event.reason or ""
    control = WebSocketControl(layer.flow, from_client, "close", own.encode(), ws_event.code)
    yield SandgateWebsocketControlHook(control)
    close = _asked_close(layer.flow)
    if close is None:
        # The sender gets its own CLOSE back; the other side what the handlers left.
        relayed = control.payload.decode("utf-8", "replace")
        code = ws_event.code
        if from_client:
            close = SessionClose(code, own, code, relayed, by_guest=True)
        else:
            close = SessionClose(code, relayed, code, own, by_guest=False)
    yield from _end(layer, state, close)


def _fault(from_client: bool) -> SessionClose:
    return SessionClose(
        CloseReason.INTERNAL_ERROR,
        f"sandgate: {Reason.INTERNAL_ERROR.value}",
        CloseReason.GOING_AWAY,
        by_guest=from_client,
    )


def _refuse_oversize(
    layer: layers.WebsocketLayer, state: _State, from_client: bool, received: int
) -> Commands:
    assert state.limit is not None
    state.guest.clear()
    state.upstream.clear()  # give the memory back now
    decision_id = new_decision_id()
    yield SandgateWebsocketOversizeHook(
        OversizedMessage(layer.flow, from_client, state.limit, received, decision_id)
    )
    text = close_reason(Reason.MESSAGE_TOO_LARGE, decision_id)
    if from_client:
        close = SessionClose(CloseReason.MESSAGE_TOO_BIG, text, CloseReason.GOING_AWAY)
    else:
        close = SessionClose(CloseReason.GOING_AWAY, text, CloseReason.MESSAGE_TOO_BIG, by_guest=False)
    yield from _end(layer, state, close)


def _end(layer: layers.WebsocketLayer, state: _State, close: SessionClose) -> Commands:
    """Send each side its CLOSE and close both connections (mitmproxy's own end, per side)."""
    state.ended = True
    state.guest.clear()
    state.upstream.clear()
    flow = layer.flow
    assert flow.websocket is not None
    flow.websocket.messages.clear()
    flow.websocket.timestamp_end = time.time()
    flow.websocket.closed_by_client = close.by_guest
    flow.websocket.close_code = close.guest_code
    flow.websocket.close_reason = close.guest_reason
    sides = (
        (layer.server_ws, close.upstream_code, close.upstream_reason),
        (layer.client_ws, close.guest_code, close.guest_reason),
    )
    for ws, code, reason in sides:
        if ws.state in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
            yield ws.send2(wsproto.events.CloseConnection(code, reason or None))
        yield commands.CloseConnection(ws.conn)
    yield layers.WebsocketEndHook(flow)
    flow.live = False
    layer._handle_event = layer.done


# -- install and check -------------------------------------------------------------------------


def install() -> None:
    """Replace mitmproxy's relay once per process (idempotent)."""
    global _ORIGINAL
    if _ORIGINAL is not None:
        return
    if not version.VERSION.startswith(_PATCHED_RELEASE):
        raise RuntimeError(
            f"sandgate's WebSocket guard is written for mitmproxy {_PATCHED_RELEASE}x, not {version.VERSION}"
        )
    _ORIGINAL = layers.WebsocketLayer.relay_messages
    layers.WebsocketLayer.relay_messages = _relay_messages  # type: ignore[method-assign]


_PROBE_LIMIT = 1024


def self_test(options: Options) -> None:
    """Drive a WebSocket layer through a PING and messages over a small cap, plain and deflated;
    RuntimeError when the seam moved or no addon declared the cap."""
    if not version.VERSION.startswith(_PATCHED_RELEASE):
        raise RuntimeError(
            f"sandgate's WebSocket guard is written for mitmproxy 12.3.x, found {version.VERSION}"
        )
    if _ORIGINAL is None or _limit(options) is None:
        raise RuntimeError(
            "WebSocket guard not installed (sandgate.proxy.mitm.websocket_guard.install, Upgrades addon)"
        )
    probe = Options()
    probe.add_option(OPT_MAX_MESSAGE, int, _PROBE_LIMIT, "the self-test's cap")
    try:
        problem = _probe_control(probe) or _probe_cap(probe, deflate=False) or _probe_cap(probe, deflate=True)
    except Exception as e:
        raise RuntimeError(f"mitmproxy's WebSocket layer changed under sandgate's guard: {e!r}") from e
    if problem is not None:
        raise RuntimeError(f"mitmproxy's WebSocket layer changed: {problem}")


def _probe_layer(options: Options, deflate: bool) -> tuple[layers.WebsocketLayer, connection.Client]:
    client = connection.Client(peername=("127.0.0.1", 1), sockname=("127.0.0.1", 2))
    server = connection.Server(address=("127.0.0.1", 3))
    flow = http.HTTPFlow(client, server)
    flow.request = http.Request.make("GET", "http://probe.invalid/")
    headers = {"Sec-WebSocket-Extensions": "permessage-deflate"} if deflate else {}
    flow.response = http.Response.make(101, b"", headers)
    flow.websocket = websocket.WebSocketData()
    context = Context(client, options)
    context.server = server
    layer = layers.WebsocketLayer(context, flow)
    _drive(layer, events.Start())
    return layer, client


def _drive(layer: layers.WebsocketLayer, event: events.Event) -> list[commands.Command]:
    """The layer's commands for `event`, every blocking hook answered as an addon-less master would."""
    out: list[commands.Command] = []
    pending = [event]
    while pending:
        for command in layer.handle_event(pending.pop()):
            out.append(command)
            if isinstance(command, commands.StartHook) and command.blocking:
                pending.append(events.HookCompleted(command))
    return out


def _guest(deflate: bool) -> Connection:
    """The guest's side of the probe: masked frames, deflated when negotiated."""
    extensions: list[Extension] = []
    if deflate:
        ext = PerMessageDeflate()
        ext.finalize("permessage-deflate")
        extensions.append(ext)
    return Connection(ConnectionType.CLIENT, extensions)


def _probe_control(options: Options) -> str | None:
    layer, client = _probe_layer(options, deflate=False)
    sent = _drive(layer, events.DataReceived(client, _guest(False).send(wsproto.events.Ping(b"probe"))))
    if not any(isinstance(c, SandgateWebsocketControlHook) for c in sent):
        return "a PING was relayed without the control hook"
    if not any(isinstance(c, commands.SendData) and c.connection is layer.context.server for c in sent):
        return "a PING was not relayed"
    return None


def _probe_cap(options: Options, deflate: bool) -> str | None:
    layer, client = _probe_layer(options, deflate)
    guest = _guest(deflate)
    what = "deflated message" if deflate else "message"
    if deflate:
        # One small frame that inflates far past the cap.
        frames = [guest.send(wsproto.events.BytesMessage(b"\0" * 64 * _PROBE_LIMIT))]
    else:
        piece = wsproto.events.BytesMessage(b"x" * (_PROBE_LIMIT // 2), message_finished=False)
        frames = [guest.send(piece) for _ in range(3)]
    sent: list[commands.Command] = []
    for frame in frames:
        sent += _drive(layer, events.DataReceived(client, frame))
    too_big = CloseReason.MESSAGE_TOO_BIG.to_bytes(2, "big")
    answered = any(
        isinstance(c, commands.SendData) and c.connection is client and c.data[2:4] == too_big for c in sent
    )
    closed = {c.connection for c in sent if isinstance(c, commands.CloseConnection)}
    state = _STATES.get(layer)
    if not answered or closed != {client, layer.context.server} or state is None or state.guest.size:
        return f"a {what} over the cap was not refused with 1009"
    hooks = [c.oversized for c in sent if isinstance(c, SandgateWebsocketOversizeHook)]
    if len(hooks) != 1:
        return f"a {what} over the cap was refused without its hook"
    if deflate and hooks[0].received != _PROBE_LIMIT + 1:
        return "a deflated message was inflated past the cap before it was refused"
    return None
