"""A worker's audit sink: each batch goes to the supervisor's collector, the one writer of the file.

`ForwardSink.write` returns only once the collector has written the batch (and fsynced it when
its file sink fsyncs); any failure raises OSError, so the worker's AuditLog keeps the records
queued and retries. A retry re-sends the same sequence number, and the collector writes a
(worker, session, seq) at most once: exactly once end to end.

Wire format (unix stream socket, big-endian, one batch in flight per connection):

    request  "SGA1" | u8 worker-id length | u64 session | u64 seq | u32 body length
             | worker id (UTF-8, 1..255 bytes) | body (the batch's JSON lines, UTF-8, each ending "\\n")
    reply    "SGA1" | u16 code (0: written, or written before; else the errno of the failed write)
             | u64 seq (the request's)

`session` is random per ForwardSink (a restarted worker starts a new one, so its sequence
numbers starting again from 1 are not taken for repeats). A body is at most MAX_BODY bytes; a
larger batch goes as several frames with consecutive numbers, each acknowledged in turn. A frame
the collector cannot parse closes that connection without a reply.

Pacing (`interval`): each batch wakes a thread of the supervisor (and the worker's writer
again for the ack); on a loaded gateway the writer would hand over a batch of one or two records
every few milliseconds, and those wake-ups were most of what a worker's records cost the
supervisor. With `interval` > 0 a small batch that follows the previous frame by less than
`interval` waits for the rest of it first, so the records of that time go together. Only
records already queued wait (the writer holds them, their intents stay open), a batch of
PACE_UNTIL records or more goes at once, and a worker whose requests wait for their record
(`audit.fsync: per_batch`) paces nothing (`forward_interval`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
import threading
import time
from pathlib import Path

from sandgate.proxy.audit.spool import Spool

__all__ = [
    "DEFAULT_INTERVAL",
    "MAGIC",
    "MAX_BODY",
    "PACE_UNTIL",
    "REPLY",
    "REQUEST",
    "ForwardSink",
    "forward_interval",
]

MAGIC = b"SGA1"
REQUEST = struct.Struct(">4sBQQI")  # magic, worker-id length, session, seq, body length
REPLY = struct.Struct(">4sHQ")  # magic, code, seq
MAX_BODY = 64 * 1024 * 1024
# Seconds between two small frames when no request waits for its record (audit.fsync: off): a
# record reaches the file at most this much later; the supervisor wakes at most 1/this per worker.
DEFAULT_INTERVAL = 0.02
# A batch of this many records goes at once: the writer is behind, batches are large already.
PACE_UNTIL = 64


class ForwardSink:
    """An AuditSink that hands each batch to the collector on `socket_path` and waits for its ack."""

    def __init__(
        self,
        socket_path: Path,
        worker: str,
        *,
        timeout: float = 10.0,
        max_body: int = MAX_BODY,
        spool: Spool | None = None,
        interval: float = 0.0,
    ) -> None:
        wid = worker.encode()
        if not 1 <= len(wid) <= 255:
            raise ValueError("worker id: 1 to 255 bytes of UTF-8")
        self.socket_path = socket_path
        self.worker = worker
        self._wid = wid
        self.timeout = timeout  # seconds to connect, and to wait for each ack (per connection)
        self._max_body = max_body
        self._session = int.from_bytes(os.urandom(8), "big")
        self._seq = 0
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()  # one batch at a time: sequence numbers stay in order
        self._closed = False
        # The batch whose write failed, and its frames not yet acknowledged: the next write of
        # the same lines is its retry and re-sends them under the same numbers.
        self._pending: list[str] | None = None
        self._frames: list[tuple[int, bytes]] = []
        self.batches = 0  # frames acknowledged
        self.failures = 0  # attempts that raised
        # Where batches go once the supervisor is gone (`orphaned`), for the next one to merge.
        self._spool = spool
        self._orphaned = threading.Event()
        # Seconds between two small frames (0: every batch goes at once).
        self.interval = max(0.0, interval)
        self._sent = -self.interval  # monotonic time the last frame was acknowledged
        self._closing = threading.Event()  # wakes a paced write at close()

    def orphaned(self) -> None:
        """The supervisor (and its collector) is gone: a batch the collector does not take from
        now on goes to the spool instead of being retried for ever."""
        self._orphaned.set()

    @property
    def spooled(self) -> int:
        """Records written to the spool."""
        return self._spool.records if self._spool is not None else 0

    def write(self, lines: list[str]) -> None:
        """Send the batch and wait until the collector has written it; OSError otherwise."""
        with self._lock:
            if self._closed:
                self._closed_write(lines)
                return
            if self._pending is None or lines != self._pending:
                self._frames = self._frame(lines)
                self._pending = list(lines)
            self._pace(len(lines))
            if self._closing.is_set():
                # close() woke the wait: sending now could race its shutdown, and a batch the
                # collector wrote whose ack was cut would read as failed and be kept twice.
                self._closed_write(lines)
                return
            try:
                while self._frames:
                    self._send(*self._frames[0])
                    del self._frames[0]
                    self.batches += 1
                    self._sent = time.monotonic()
            except OSError:
                self.failures += 1
                if self._spool is None or not self._orphaned.is_set():
                    raise
                # Whole: a frame the dying collector wrote is skipped when the spool is merged.
                self._spool.write(lines)
                self._frames = []
            self._pending = None

    def _closed_write(self, lines: list[str]) -> None:
        """A batch written after close(): spooled once the supervisor is gone (nobody else will
        take it), else OSError (the AuditLog keeps it)."""
        if self._spool is None or not self._orphaned.is_set():
            raise OSError(errno.EBADF, "audit forwarder closed")
        self._spool.write(lines)
        self._frames, self._pending = [], None

    def _pace(self, records: int) -> None:
        """Wait out the rest of `interval` since the last frame for a small batch."""
        if self.interval <= 0 or records >= PACE_UNTIL:
            return
        wait = self._sent + self.interval - time.monotonic()
        if wait > 0:
            self._closing.wait(wait)

    def close(self) -> None:
        """Close the connection; later writes fail."""
        self._closed = True
        self._closing.set()
        sock = self._sock
        if sock is not None:
            # Wakes a write waiting for its ack in another thread; it then fails and drops it.
            _shutdown(sock)
        with self._lock:
            self._drop()

    def _frame(self, lines: list[str]) -> list[tuple[int, bytes]]:
        """The batch as numbered frames of at most max_body bytes each (one, nearly always)."""
        body = "".join(lines).encode()
        if len(body) <= self._max_body:
            return [self._numbered(body)]
        frames: list[tuple[int, bytes]] = []
        part: list[bytes] = []
        size = 0
        for line in lines:
            data = line.encode()
            if part and size + len(data) > self._max_body:
                frames.append(self._numbered(b"".join(part)))
                part, size = [], 0
            part.append(data)
            size += len(data)
        frames.append(self._numbered(b"".join(part)))
        return frames

    def _numbered(self, body: bytes) -> tuple[int, bytes]:
        self._seq += 1
        head = REQUEST.pack(MAGIC, len(self._wid), self._session, self._seq, len(body))
        return self._seq, head + self._wid + body

    def _send(self, seq: int, frame: bytes) -> None:
        """One frame, acknowledged; any failure drops the connection (a late ack must never be
        read as the answer to a later frame) and raises OSError."""
        try:
            sock = self._connect()
            sock.sendall(frame)
            reply = _recv_exact(sock, REPLY.size)
            magic, code, acked = REPLY.unpack(reply)
            if magic != MAGIC or acked != seq:
                raise OSError(errno.EPROTO, "audit collector: unexpected reply")
        except OSError:
            self._drop()
            raise
        if code:
            # The collector's sink failed (a full disk): nothing of the batch stays written.
            raise OSError(code, f"audit collector could not write: {os.strerror(code)}")

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(str(self.socket_path))
            except OSError:
                sock.close()
                raise
            self._sock = sock
        return self._sock

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


def forward_interval(fsync: str) -> float:
    """The pacing for a worker whose trail has this `audit.fsync` mode: none while requests
    wait for their record to be written (per_batch)."""
    return 0.0 if fsync == "per_batch" else DEFAULT_INTERVAL


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    """Exactly `size` bytes; ConnectionError when the peer closes first."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError(errno.ECONNRESET, "audit collector closed the connection")
        got += n
    return bytes(buf)
