"""PassthroughFront: the explicit listener's first reader, passing allowed TLS tunnels through itself.

Per connection, in the order mitmproxy's addons would decide it (their rules, not a copy):
connection caps at accept (ConnectionLimits), the CONNECT head (strict: anything unusual is
mitmproxy's), the proxy credential, the per-sandbox cap, the policy decision (with the
credential broker's inspection), the ClientHello's SNI (`require_sni`), the tenant's limits
on a tunnel, then the dial to exactly the checked address. The CONNECT is recorded when it
is answered, the TLS decision when the ClientHello is read, a limit when one refuses: the
records mitmproxy's path writes for the same tunnel.

Handed to mitmproxy (its `handle_stream`, the bytes read so far put back first) before the
front has answered: a first request that is not a plain CONNECT, or not complete within
FIRST_HEAD_WAIT; a missing or wrong credential; a refusal of any kind; a tunnel that is
intercepted or raw TCP; a gateway that is draining. mitmproxy decides and records those again,
except a CONNECT the front allowed: its tunnel gate goes on with the front's decision
(`GatewayContext.front_decided`) instead of deciding it a second time.
After the front answered 200, a tunnel whose first bytes are not a TLS ClientHello it can
read (plain HTTP in the tunnel, say) is handed over too: the CONNECT is replayed, mitmproxy's
answer to it is swallowed (the guest has one already) and the tunnel gate skips the CONNECT
record the front wrote; a different answer closes the connection.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from sandgate.policy.decision import Decision, EgressRequest, Identity, Phase
from sandgate.policy.errors import HostError
from sandgate.policy.hosts import split_authority
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.connection_limits import ConnectionLimits
from sandgate.proxy.addons.drain import Drainer
from sandgate.proxy.addons.guest_peer import (
    RECLAIM_AFTER_SECONDS,
    client_address,
    parse_proxy_authorization,
    peer_ip,
    unread,
)
from sandgate.proxy.addons.tunnel_rules import admit_tunnel, count_tunnel_bytes, tls_decision
from sandgate.proxy.audit.records import decision_record
from sandgate.proxy.config import ConnectionsConfig, HeadsConfig
from sandgate.proxy.context import ConnectionState, FrontDecision, GatewayContext
from sandgate.proxy.front.client_hello import INCOMPLETE, NOT_READABLE, read_sni
from sandgate.proxy.front.connect_head import HEAD_END, looks_like_connect, read_connect_head
from sandgate.proxy.front.handoff import hand_off, stream_buffer
from sandgate.proxy.front.splice import Splice
from sandgate.proxy.tasks import BackgroundTask

__all__ = ["FIRST_HEAD_WAIT", "PassthroughFront"]

log = structlog.get_logger("sandgate.front")

# How long the front waits for a whole CONNECT head before it hands the connection to mitmproxy
# (whose head caps and timeouts then apply): a client sends its head as soon as it connects, so
# only slow or hostile ones wait, and for them this is at most this much longer than without it.
FIRST_HEAD_WAIT = 0.25
_READ = 64 * 1024
_TLS_HANDSHAKE = 0x16

StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass(slots=True)
class _Held:
    """A connection the front holds: its streams (to close it) and, once spliced, its tunnel.
    As connection limits see it (`Reclaimable`): idle while it has sent nothing at all."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    splice: Splice | None = None
    started: float = field(default_factory=time.monotonic)
    heard: bool = False  # a byte of the guest's was read

    def idle(self) -> bool:
        # The front holds a connection for FIRST_HEAD_WAIT, less than RECLAIM_AFTER_SECONDS:
        # this is for a longer wait, should there ever be one.
        quiet = time.monotonic() - self.started >= RECLAIM_AFTER_SECONDS
        return quiet and not self.heard and self.splice is None and not unread(self.reader, self.writer)

    def close(self) -> None:
        self.writer.transport.abort()


class PassthroughFront:
    """Reads each new explicit-listener connection first; passes allowed TLS tunnels through."""

    def __init__(
        self,
        ctx: GatewayContext,
        limits: ConnectionLimits,
        drainer: Drainer,
        *,
        heads: HeadsConfig,
        connections: ConnectionsConfig,
        require_sni: bool,
    ) -> None:
        self.ctx = ctx
        self.limits = limits
        self.drainer = drainer
        self.heads = heads
        self.connections = connections
        self.require_sni = require_sni
        self._held: dict[str, _Held] = {}
        self._ids = itertools.count(1)
        self._sweeper = BackgroundTask("sandgate-front-sweep", self._sweep_loop)
        # Counters for /v1/status and the benchmark: tunnels spliced here, connections handed on.
        self.spliced = 0
        self.handed_off = 0

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._sweeper.start()

    async def stop(self) -> None:
        await self._sweeper.stop()

    def handler_for(self, listener: str, mitmproxy_handler: StreamHandler) -> StreamHandler:
        """The stream handler of one explicit listener (`listener`: its mode spec)."""

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(reader, writer, listener, mitmproxy_handler)

        return handle

    # -- for the drain -----------------------------------------------------------------------

    def tunnels(self) -> int:
        """Spliced tunnels open now (in flight until they close, as mitmproxy's are)."""
        return sum(1 for held in self._held.values() if held.splice is not None)

    def open(self) -> int:
        return len(self._held)

    def close_idle(self) -> int:
        """Close the connections not spliced yet (nothing in flight on them); how many."""
        closed = 0
        for held in list(self._held.values()):
            if held.splice is None and not held.writer.is_closing():
                held.writer.close()
                closed += 1
        return closed

    def close_all(self) -> int:
        """Cut every connection the front holds (the drain's end); how many."""
        closed = 0
        for held in list(self._held.values()):
            if held.splice is not None:
                held.splice.abort()
            elif not held.writer.is_closing():
                held.writer.transport.abort()
            closed += 1
        return closed

    # -- one connection ----------------------------------------------------------------------

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        listener: str,
        mitmproxy_handler: StreamHandler,
    ) -> None:
        key = f"front-{next(self._ids)}"
        peer = writer.get_extra_info("peername")
        held = _Held(reader, writer)
        if not self.limits.admit_front(key, peer, listener, held):
            # Over a cap: mitmproxy's ConnectionLimits refuses it (and audits) as it always has.
            await mitmproxy_handler(reader, writer)
            return
        self._held[key] = held
        state = ConnectionState(listener=listener, client=client_address(peer))
        self.ctx.connections[key] = state
        handoff: tuple[bytes, bool] | None = None
        try:
            handoff = await self._front(key, held, state, reader, writer, peer_ip(peer))
        except Exception:
            log.exception("front.failed", client=state.client)
            writer.transport.abort()
        finally:
            del self._held[key]
            self.ctx.connections.pop(key, None)
            self.limits.release_front(key, upstream=held.splice is not None)
        if handoff is not None:
            replay, answered = handoff
            self.handed_off += 1
            # Admitted here: mitmproxy counts it without deciding its admission again.
            self.limits.expect_handoff(peer)
            try:
                await hand_off(reader, writer, replay, answered, mitmproxy_handler)
            except Exception:
                log.exception("front.handoff_failed", client=state.client)
                writer.transport.abort()
            finally:
                # Unused when mitmproxy refused before its tunnel gate: never left for a later connection.
                self.ctx.front_decided.pop(peer, None)
                self.limits.forget_handoff(peer)

    async def _front(
        self,
        key: str,
        held: _Held,
        state: ConnectionState,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client_ip: str | None,
    ) -> tuple[bytes, bool] | None:
        """Serve the connection here (None once it is closed) or say what mitmproxy gets:
        (the bytes to put back, whether the guest already has a 200 for the CONNECT in them)."""
        data = await self._read_head(reader, held)
        if not data and reader.at_eof():
            writer.close()  # closed before its first byte (a port probe): nothing to decide
            return None
        head = read_connect_head(data, max_bytes=self.heads.max_bytes, max_lines=self.heads.max_lines)
        if head is None or self.drainer.draining:
            return data, False
        credentials = parse_proxy_authorization(head.proxy_authorization)
        identity = self.ctx.policy.authenticate(*credentials) if credentials is not None else None
        if identity is None or not self.limits.attribute_front(key, identity.sandbox):
            return data, False
        try:
            host, port = split_authority(head.authority, 443)
        except (HostError, ValueError):
            return data, False
        if ":" not in head.authority.rpartition("]")[2]:
            return data, False  # a CONNECT without a port is mitmproxy's to refuse
        state.identified(identity)
        decision = await self._decide(
            state, identity, EgressRequest(Phase.CONNECT, host, port, client=client_ip)
        )
        if decision is None or not decision.allowed or decision.address is None:
            return data, False
        peer = writer.get_extra_info("peername")
        if decision.inspect or decision.raw_tcp:
            # mitmproxy's to intercept (or relay raw): its tunnel gate goes on with this decision.
            self.ctx.front_decided[peer] = FrontDecision(identity, host, port, decision, recorded=False)
            return data, False
        state.tunnel_approved(host, port, decision)
        if not await self.ctx.audit.emit(decision_record(state.decision_context(Phase.CONNECT), decision)):
            return data, False  # not recorded: mitmproxy refuses it (and counts the full queue)
        writer.write(f"{head.http_version} 200 Connection established\r\n\r\n".encode("ascii"))
        hello_bytes = data[head.size :]
        hello = await self._read_client_hello(reader, hello_bytes)
        if hello is None:
            return None  # closed or silent: the CONNECT's record stands, nothing was dialled
        if isinstance(hello, bytes):
            # Not TLS the front can read: mitmproxy takes the tunnel (the CONNECT is replayed).
            self.ctx.front_decided[peer] = FrontDecision(identity, host, port, decision, recorded=True)
            return data[: head.size] + hello, True
        hello_data, sni = hello
        if not await self._accept_hello(state, sni, decision):
            writer.transport.abort()
            return None
        if await admit_tunnel(self.ctx, state) is not None:
            writer.transport.abort()  # over a limit: recorded by admit_tunnel
            return None
        await self._splice(held, state, reader, writer, hello_data, decision.address, port)
        return None

    async def _decide(
        self, state: ConnectionState, identity: Identity, request: EgressRequest
    ) -> Decision | None:
        """The CONNECT's decision, the credential broker's interception included; None on a fault
        (nothing answered yet: mitmproxy's tunnel gate decides again, and records what fails)."""
        try:
            decision = await self.ctx.decide(identity, request)
            return self.ctx.with_credentials(decision, identity, request.host, request.port)
        except Exception:
            log.exception("front.decide_failed", client=state.client)
            return None

    async def _read_head(self, reader: asyncio.StreamReader, held: _Held) -> bytes:
        """The bytes of the first request head, or what arrived of it in FIRST_HEAD_WAIT."""
        data = b""
        deadline = time.monotonic() + FIRST_HEAD_WAIT
        while HEAD_END not in data and looks_like_connect(data) and len(data) <= self.heads.max_bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                chunk = await asyncio.wait_for(reader.read(_READ), remaining)
            except TimeoutError:
                break
            if not chunk:
                break
            held.heard = True
            data += chunk
        return data

    async def _read_client_hello(
        self, reader: asyncio.StreamReader, data: bytes
    ) -> tuple[bytes, str | None] | bytes | None:
        """The tunnel's first bytes: (bytes, SNI) for a whole ClientHello; the bytes when they are
        not one the front reads (mitmproxy's); None when the guest closed or stayed silent."""
        deadline = time.monotonic() + self.connections.idle_timeout_seconds
        while True:
            if data:
                if data[0] != _TLS_HANDSHAKE or len(data) > self.heads.max_bytes:
                    return data
                sni = read_sni(data)
                if sni is NOT_READABLE:
                    return data
                if sni is not INCOMPLETE:
                    return data, sni[0]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                chunk = await asyncio.wait_for(reader.read(_READ), remaining)
            except TimeoutError:
                return None
            if not chunk:
                return None
            data += chunk

    async def _accept_hello(self, state: ConnectionState, sni: str | None, decision: Decision) -> bool:
        """Record the TLS decision on the ClientHello; whether the tunnel may go on."""
        dctx = state.decision_context(Phase.TLS, sni=sni)
        decision = tls_decision(sni, state.tunnel_host, decision, require_sni=self.require_sni)
        queued = await self.ctx.audit.emit(decision_record(dctx, decision))
        if not decision.allowed or not queued:
            state.refused(decision.reason if queued else Reason.INTERNAL_ERROR)
            return False
        state.tls_accepted(sni, passthrough=True)
        return True

    async def _splice(
        self,
        held: _Held,
        state: ConnectionState,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        hello: bytes,
        address: str,
        port: int,
    ) -> None:
        """Dial exactly the checked address and pass bytes both ways until either side closes."""
        loop = asyncio.get_running_loop()
        ctx = self.ctx
        # Every chunk the guest sends counts against its tenant's byte limits (as the limits are
        # then: a reload that adds one applies to open tunnels too).
        splice = Splice(lambda nbytes: count_tunnel_bytes(ctx, state, nbytes))
        try:
            await asyncio.wait_for(
                loop.create_connection(splice.upstream_protocol, address, port),
                self.connections.idle_timeout_seconds,
            )
        except (OSError, TimeoutError) as e:
            why = str(e) or type(e).__name__
            log.info("front.upstream_failed", client=state.client, host=state.tunnel_host, error=why)
            writer.transport.abort()
            return
        held.splice = splice
        self.limits.upstream_opened()
        self.spliced += 1
        client = writer.transport
        assert isinstance(client, asyncio.Transport)
        # What the stream read past the ClientHello goes upstream right after it.
        pending = hello + bytes(_buffered(reader))
        splice.join(client, writer, pending)
        await splice.done

    # -- the tunnel idle timeout -------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        idle = self.connections.tunnel_idle_timeout_seconds
        tick = min(1.0, idle / 4)
        while True:
            await asyncio.sleep(tick)
            try:
                self.sweep(time.monotonic())
            except Exception:
                log.exception("front.sweep_failed")

    def sweep(self, now: float) -> int:
        """Close the tunnels silent both ways for `tunnel_idle_timeout_seconds`; how many."""
        idle = self.connections.tunnel_idle_timeout_seconds
        closed = 0
        for held in list(self._held.values()):
            if held.splice is not None and now - held.splice.last_activity >= idle:
                held.splice.close()
                closed += 1
        return closed


def _buffered(reader: asyncio.StreamReader) -> bytearray:
    """What the stream has read from the socket and not handed out yet (taken from it)."""
    buffer = stream_buffer(reader)
    taken = bytearray(buffer)
    buffer.clear()
    return taken
