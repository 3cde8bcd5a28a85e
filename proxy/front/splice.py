"""Two sockets joined byte for byte: a passed-through tunnel, with its activity clock and byte counts.

Protocols, not streams: each side's bytes are written to the other as they arrive, with
back-pressure both ways (a side whose write buffer passes asyncio's default 64 KiB pauses
the other side's reads: what one tunnel holds stays bounded), a
half-close carried across, and either side's close closing both. No per-chunk hook runs: the
tunnel's idle timeout is a sweep over `last_activity` (PassthroughFront), not a timer per read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

__all__ = ["Splice", "UpMeter"]

log = structlog.get_logger("sandgate.front")

# Counts the bytes a guest sends upstream; False: cut the tunnel (over a byte limit).
UpMeter = Callable[[int], bool]


class _Side(asyncio.Protocol):
    """Reads one socket and writes what it reads to the other (`peer`)."""

    __slots__ = ("eof", "peer", "splice", "transport", "upstream")

    def __init__(self, splice: Splice, *, upstream: bool) -> None:
        self.splice = splice
        self.upstream = upstream
        self.transport: asyncio.Transport | None = None
        self.peer: asyncio.Transport | None = None
        self.eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        splice = self.splice
        splice.last_activity = time.monotonic()
        if self.upstream:
            splice.bytes_down += len(data)
        else:
            splice.bytes_up += len(data)
            if splice.meter is not None and not splice.metered(len(data)):
                splice.abort()  # over a byte limit (recorded by the meter): this chunk stays here
                return
        if self.peer is not None:
            self.peer.write(data)

    def eof_received(self) -> bool:
        self.eof = True
        self.splice.last_activity = time.monotonic()
        if self.peer is not None and not self.peer.is_closing() and self.peer.can_write_eof():
            self.peer.write_eof()
        if self.splice.both_ended():
            self.splice.close()
        return True  # keep the transport: the other direction may still be sending

    def connection_lost(self, exc: Exception | None) -> None:
        self.splice.close()

    # This side's write buffer is full: stop reading what fills it (the other side).
    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.resume_reading()


class Splice:
    """A tunnel between a guest's transport and its upstream's; `done` resolves when both closed."""

    def __init__(self, meter: UpMeter | None = None) -> None:
        self.meter = meter
        self.client_side = _Side(self, upstream=False)
        self.upstream_side = _Side(self, upstream=True)
        self.bytes_up = 0
        self.bytes_down = 0
        self.last_activity = time.monotonic()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._keep: object = None

    def metered(self, nbytes: int) -> bool:
        """The meter's answer for `nbytes` more upstream; a meter that fails cuts the tunnel."""
        assert self.meter is not None
        try:
            return self.meter(nbytes)
        except Exception:
            log.exception("front.meter_failed")
            return False

    def upstream_protocol(self) -> asyncio.Protocol:
        """The protocol for the upstream connection (loop.create_connection's factory result)."""
        return self.upstream_side

    def join(self, client: asyncio.Transport, keep: object, pending: bytes) -> None:
        """Take `client` over from its stream and start passing bytes; `pending` (the bytes
        read from it so far) goes upstream first. `keep` holds the stream's writer, whose
        collection would close the transport."""
        upstream = self.upstream_side.transport
        if upstream is None:
            raise RuntimeError("the upstream is not connected")
        self._keep = keep
        self.client_side.transport = client
        self.client_side.peer = upstream
        self.upstream_side.peer = client
        if pending:
            self.bytes_up += len(pending)
            if self.meter is not None and not self.metered(len(pending)):
                self.abort()
                return
            upstream.write(pending)
        client.set_protocol(self.client_side)
        if client.is_closing():
            self.close()
        elif not client.is_reading():
            client.resume_reading()

    def both_ended(self) -> bool:
        return self.client_side.eof and self.upstream_side.eof

    def close(self) -> None:
        """Close both sides (idempotent); `done` resolves."""
        for side in (self.client_side, self.upstream_side):
            if side.transport is not None and not side.transport.is_closing():
                side.transport.close()
        if not self.done.done():
            self.done.set_result(None)
        self._keep = None

    def abort(self) -> None:
        """Cut both sides at once (drain's end): unsent bytes are dropped."""
        for side in (self.client_side, self.upstream_side):
            if side.transport is not None:
                side.transport.abort()
        self.close()
