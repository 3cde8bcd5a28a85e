"""Addon: bound the work one intercepted HTTP/2 connection can make the gateway do.

HTTP/2 rapid reset (CVE-2023-44487): a client opens a stream and resets it at once, over and
over. A reset stream no longer counts against SETTINGS_MAX_CONCURRENT_STREAMS, but every
HEADERS still became a flow whose hooks (identity, policy, audit) ran to the end: 85,000 pairs
in 4 s kept the gateway busy for minutes and grew it past 1 GB. Here, per client connection:

- SETTINGS_MAX_CONCURRENT_STREAMS is `http2.max_concurrent_streams` (h2 enforces it on open
  streams);
- the streams in the gateway's hands (mitmproxy's HttpLayer streams: reset ones stay there until
  their hooks finish) are capped at the same number: a new stream past it is refused with
  RST_STREAM(REFUSED_STREAM) before any hook sees it;
- every stream the client resets and every stream refused is a strike; more than
  `http2.max_resets` strikes in `http2.reset_window_seconds` is abuse: GOAWAY(ENHANCE_YOUR_CALM),
  every stream in progress ends, what the client still sends is discarded for a second (a
  close with unread input would send RST and lose the GOAWAY), the connection closes, and one
  `protocol_abuse` record is audited (as nginx and Go do).

The seam: mitmproxy's HttpLayer takes a pre-set `connections[client]` (client replay uses it),
so the `next_layer` hook hands it a subclass of mitmproxy's Http2Server. `check_seam` proves at
start-up, on a real layer, that the subclass is used and enforces; mitmproxy is pinned to 12.3.x.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace

import h2.connection
import h2.errors
import h2.events
import h2.settings
import structlog
from mitmproxy import connection, http, options
from mitmproxy import version as mitmproxy_version
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.http import HttpLayer, HTTPMode
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._http2 import Http2Server

from sandgate.policy.decision import Decision, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.exchange import Exchange, exchange_context
from sandgate.proxy.audit.records import decision_record
from sandgate.proxy.config import Http2Config
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.tasks import TaskSet

__all__ = ["GuardedHttp2Server", "H2Guard", "check_seam"]

log = structlog.get_logger("sandgate.h2guard")

SUPPORTED_MITMPROXY = "12.3."
# After GOAWAY, how long the connection stays open (reading and discarding) before it closes.
LINGER_SECONDS = 1.0

# Called once per abusive connection with the client, what it did, and the flows of the
# streams in progress that the GOAWAY cuts (their records are the abuse record's to write).
AbuseCallback = Callable[[connection.Client, str, list[http.HTTPFlow]], None]


class GuardedHttp2Server(Http2Server):
    """mitmproxy's HTTP/2 server side, with a bound on streams, resets and queued work."""

    def __init__(
        self, context: Context, http_layer: HttpLayer, limits: Http2Config, on_abuse: AbuseCallback
    ) -> None:
        super().__init__(context)
        self._http_layer = http_layer
        self._limits = limits
        self._on_abuse = on_abuse
        self._strikes: deque[float] = deque()
        # Applied before the connection preface goes out, so the first SETTINGS frame carries it.
        self.h2_conn.local_settings.max_concurrent_streams = limits.max_concurrent_streams
        self.h2_conn.local_settings.acknowledge()

    def handle_h2_event(self, event: h2.events.Event) -> layer.CommandGenerator[bool]:
        if isinstance(event, h2.events.RequestReceived):
            if len(self._http_layer.streams) >= self._limits.max_concurrent_streams:
                # Too much work already queued on this connection: refused before any hook runs
                # (h2 reports events after the whole read: the client may have reset it already).
                if not self.is_closed(event.stream_id):
                    self.h2_conn.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
                return (yield from self._strike())
        elif isinstance(event, h2.events.StreamReset) and event.remote_reset and (yield from self._strike()):
            return True
        return (yield from super().handle_h2_event(event))

    def _strike(self) -> layer.CommandGenerator[bool]:
        """Count a reset or refused stream; past the limit, GOAWAY and close (returns True)."""
        now = time.monotonic()
        window = self._limits.reset_window_seconds
        self._strikes.append(now)
        while self._strikes and self._strikes[0] <= now - window:
            self._strikes.popleft()
        if len(self._strikes) <= self._limits.max_resets:
            return False
        detail = f"HTTP/2: more than {self._limits.max_resets} streams reset or refused in {window:g} s"
        self._strikes.clear()
        self._on_abuse(self.context.client, detail, self._flows_in_progress())
        yield from self._goaway(detail)
        return True

    def _flows_in_progress(self) -> list[http.HTTPFlow]:
        """The flows of the streams the gateway still has in hand (the GOAWAY ends them)."""
        flows = (getattr(stream, "flow", None) for stream in self._http_layer.streams.values())
        return [f for f in flows if isinstance(f, http.HTTPFlow)]

    def _goaway(self, detail: str) -> layer.CommandGenerator[None]:
        """GOAWAY(ENHANCE_YOUR_CALM), end every stream in progress, close after a short linger."""
        self.h2_conn.close_connection(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, detail.encode())
        yield commands.SendData(self.conn, self.h2_conn.data_to_send())
        for stream_id in self.streams:
            yield ReceiveHttp(self.ReceiveProtocolError(stream_id, detail, self.ReceiveProtocolError.code))
        self.streams.clear()
        # Closing with the client's input unread sends RST, and a client that gets RST drops the
        # GOAWAY it has not read yet: linger (discarding what it still sends), then close.
        self._handle_event = self._lingering  # type: ignore[method-assign]
        yield commands.RequestWakeup(LINGER_SECONDS)

    def _lingering(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.Wakeup | events.ConnectionClosed):
            self._handle_event = self.done  # type: ignore[method-assign]
            yield commands.CloseConnection(self.conn)


def install(nextlayer_layer: layer.Layer | None, limits: Http2Config, on_abuse: AbuseCallback) -> bool:
    """Give an HTTP layer about to start on an h2 client connection the guarded server side."""
    if not isinstance(nextlayer_layer, HttpLayer):
        return False
    client = nextlayer_layer.context.client
    if client.alpn != b"h2" or client in nextlayer_layer.connections:
        return False
    server = GuardedHttp2Server(nextlayer_layer.context.fork(), nextlayer_layer, limits, on_abuse)
    nextlayer_layer.connections[client] = server
    return True


class H2Guard:
    """Addon (after mitmproxy's NextLayer): guards every intercepted HTTP/2 client connection."""

    def __init__(self, ctx: GatewayContext, limits: Http2Config) -> None:
        self.ctx = ctx
        self.limits = limits
        self.abusive = 0
        self._tasks = TaskSet()

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        try:
            install(nextlayer.layer, self.limits, self._abuse)
        except Exception:
            # Fail closed: an h2 connection the guard cannot watch is not served.
            log.exception("hook_failed", hook="h2guard.next_layer")
            nextlayer.layer = None
            nextlayer.context.client.error = "sandgate: internal error"

    def _abuse(self, client: connection.Client, detail: str, cut: list[http.HTTPFlow]) -> None:
        """One audit record and one (rate-limited) log line per abusive connection. The record
        stands for the requests in progress that the GOAWAY cuts too: it names their decisions
        (`streams_cut`), and they get no record of their own."""
        self.abusive += 1
        state = self.ctx.connections.get(client.id)
        if state is not None:
            state.refused(Reason.PROTOCOL_ABUSE)
        dctx = exchange_context(state, client, Phase.REQUEST)
        if state is not None:
            dctx = replace(dctx, sni=state.sni)
        decision = Decision(
            reason=Reason.PROTOCOL_ABUSE, policy_version=self.ctx.policy.version, detail=detail
        )
        record = decision_record(dctx, decision)
        record["streams_cut"] = streams = _take_pending(cut)
        # Journaled before their own intents close: a death before the write still records them.
        self.ctx.audit.cover(record, streams)
        log.warning("h2.abuse", client=dctx.client, detail=detail, streams_cut=len(streams))
        self._tasks.spawn(self.ctx.audit.emit(record), name="sandgate-h2-audit")


def _take_pending(flows: list[http.HTTPFlow]) -> list[str]:
    """The decision ids of the flows' records still to write, taken off them."""
    taken = []
    for flow in flows:
        decision_id = Exchange.of(flow).covered()
        if decision_id is not None:
            taken.append(decision_id)
    return taken


def check_seam(opts: options.Options) -> None:
    """Prove on a real HttpLayer that the guard is installed and enforces; RuntimeError if not.

    Runs with small limits (a few streams) so it costs milliseconds; the values are config.
    """
    if not mitmproxy_version.VERSION.startswith(SUPPORTED_MITMPROXY):
        raise RuntimeError(
            f"sandgate's HTTP/2 guard is written for mitmproxy {SUPPORTED_MITMPROXY}x, "
            f"found {mitmproxy_version.VERSION}"
        )
    limits = Http2Config(max_concurrent_streams=3, max_resets=5)
    client = connection.Client(peername=("127.0.0.1", 1), sockname=("127.0.0.1", 2), alpn=b"h2")
    context = Context(client, opts)
    context.server.address = ("seam.test", 443)
    http_layer = HttpLayer(context, HTTPMode.transparent)
    abuse: list[str] = []
    if not install(http_layer, limits, lambda _c, detail, _cut: abuse.append(detail)):
        raise RuntimeError("mitmproxy's HttpLayer no longer takes a pre-set HTTP/2 server side")
    sent = _sent(http_layer.handle_event(events.Start()))
    if not isinstance(http_layer.connections.get(client), GuardedHttp2Server):
        raise RuntimeError("mitmproxy's HttpLayer replaced the guarded HTTP/2 server side")
    peer = h2.connection.H2Connection()
    peer.initiate_connection()
    announced = [
        e.changed_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS].new_value
        for e in peer.receive_data(sent)
        if isinstance(e, h2.events.RemoteSettingsChanged)
        and h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS in e.changed_settings
    ]
    if announced != [limits.max_concurrent_streams]:
        raise RuntimeError(
            f"the guarded HTTP/2 server announced {announced}, not {limits.max_concurrent_streams}"
        )
    # A rapid-reset burst: open and reset streams until the guard must have sent GOAWAY.
    headers = [(":method", "GET"), (":scheme", "https"), (":authority", "seam.test"), (":path", "/")]
    for _ in range(limits.max_resets + limits.max_concurrent_streams + 2):
        stream_id = peer.get_next_available_stream_id()
        peer.send_headers(stream_id, headers, end_stream=True)
        peer.reset_stream(stream_id)
    cmds = list(http_layer.handle_event(events.DataReceived(client, peer.data_to_send())))
    goaway = [
        e for e in peer.receive_data(_sent(iter(cmds))) if isinstance(e, h2.events.ConnectionTerminated)
    ]
    wakeups = [c for c in cmds if isinstance(c, commands.RequestWakeup)]
    if not (abuse and wakeups and goaway and goaway[0].error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM):
        raise RuntimeError("the guarded HTTP/2 server did not end a rapid-reset burst with GOAWAY")
    # After the linger, the connection closes.
    cmds = list(http_layer.handle_event(events.Wakeup(wakeups[-1])))
    if not any(isinstance(c, commands.CloseConnection) and c.connection is client for c in cmds):
        raise RuntimeError("the guarded HTTP/2 server did not close after GOAWAY")


def _sent(cmds: Iterable[commands.Command]) -> bytes:
    return b"".join(c.data for c in cmds if isinstance(c, commands.SendData))
