"""The supervisor's audit collector: the one writer of the audit file for every worker.

Workers send batches with ForwardSink (the wire format is in sandgate.proxy.audit.forward). A
thread accepts on a unix socket (mode 0600, in a folder no other user can write to), one small
thread serves each connection, and one lock around the sink keeps each batch whole and the
check-then-write of its number atomic. Per batch: a (worker, session, seq) already written is
acknowledged without writing (its ack was lost, the worker sent it again); otherwise the batch
is written (the sink fsyncs when configured) and then acknowledged; a sink that fails
(OSError) leaves nothing of the batch written (JsonlFileSink cuts a torn batch) and the reply
carries the errno, so the worker retries. A frame that cannot be parsed (bad magic, an
oversize or malformed body) closes that connection only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from sandgate.proxy.audit.forward import MAGIC, MAX_BODY, REPLY, REQUEST
from sandgate.proxy.errors import ListenerError
from sandgate.proxy.state.unix_sockets import answers

if TYPE_CHECKING:
    from sandgate.proxy.audit.trail import AuditSink

__all__ = ["AuditCollector"]

log = structlog.get_logger("sandgate.audit")

# Sessions (one per worker process) whose last written number is remembered; the active ones
# are touched by every batch, so only long-gone workers fall out.
_SESSIONS = 1024


class _BadFrame(Exception):
    """A frame that does not follow the wire format; its connection is closed."""


class AuditCollector:
    """Accepts workers' batches on `socket_path` and writes each exactly once to `sink`."""

    def __init__(self, socket_path: Path, sink: AuditSink, *, max_body: int = MAX_BODY) -> None:
        self.socket_path = socket_path
        self._sink = sink
        self._max_body = max_body
        self._sink_lock = threading.Lock()  # the sink, and the numbers written with it
        self._last: OrderedDict[tuple[bytes, int], int] = OrderedDict()
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._conns_lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._accepter: threading.Thread | None = None
        self._inode: int | None = None
        self._stop = threading.Event()
        self._sink_closed = False
        self.written = 0  # records written
        self.duplicates = 0  # batches acknowledged without writing (sent again after a lost ack)
        self.failed = 0  # batches the sink refused (answered with an errno)
        self.bad_frames = 0  # connections closed for a frame off the wire format

    def start(self) -> None:
        """Bind the socket and start accepting; ListenerError when it cannot (or another
        collector answers on it)."""
        self._listener = _bind(self.socket_path)
        self._inode = os.stat(self.socket_path).st_ino
        self._accepter = threading.Thread(target=self._accept, name="sandgate-audit-collector", daemon=True)
        self._accepter.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting, close every connection, wait for batches being written, close the sink."""
        if self._stop.is_set():
            return
        self._stop.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown wakes the accepting thread (accept fails with EINVAL).
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        if self._accepter is not None:
            self._accepter.join(timeout)
        with self._conns_lock:
            conns = list(self._conns.items())
        for conn, _ in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for _, thread in conns:
            thread.join(timeout)
        with self._sink_lock:
            self._sink_closed = True
            self._sink.close()
        self._unlink()

    def write_lines(self, lines: list[str]) -> None:
        """Write records of the supervisor's own (a spool merged, intents of a worker that
        died) between the workers' batches; OSError when the sink cannot."""
        with self._sink_lock:
            if self._sink_closed:
                raise OSError(errno.ESHUTDOWN, "audit collector closed")
            self._sink.write(lines)
            self.written += len(lines)

    # -- connections -------------------------------------------------------------------------

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.05)  # out of descriptors, say: try again without spinning
                continue
            thread = threading.Thread(
                target=self._serve, args=(conn,), name="sandgate-audit-conn", daemon=True
            )
            with self._conns_lock:
                if self._stop.is_set():
                    conn.close()
                    return
                self._conns[conn] = thread
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        """Batches from one worker connection until it closes or sends a bad frame."""
        try:
            while True:
                frame = self._read(conn)
                if frame is None:
                    return  # closed between frames
                worker, session, seq, body = frame
                code = self._store(worker, session, seq, body)
                conn.sendall(REPLY.pack(MAGIC, code, seq))
        except _BadFrame as e:
            self.bad_frames += 1
            log.warning("audit.collector_bad_frame", why=str(e))
        except OSError:
            pass  # the worker went away (killed, timed out); it sends again on a new connection
        finally:
            with self._conns_lock:
                self._conns.pop(conn, None)
            conn.close()

    def _read(self, conn: socket.socket) -> tuple[bytes, int, int, bytes] | None:
        """The next frame (worker, session, seq, body), or None at a clean end of stream."""
        head = _recv_exact(conn, REQUEST.size)
        if head is None:
            return None  # closed (between frames, or killed while sending a header)
        magic, wid_len, session, seq, body_len = REQUEST.unpack(head)
        if magic != MAGIC:
            raise _BadFrame("bad magic")
        if wid_len == 0:
            raise _BadFrame("empty worker id")
        if body_len > self._max_body:
            raise _BadFrame(f"body of {body_len} bytes over the {self._max_body} limit")
        rest = _recv_exact(conn, wid_len + body_len)
        if rest is None:
            raise ConnectionError(errno.ECONNRESET, "closed mid-frame")  # e.g. a killed worker
        body = bytes(rest[wid_len:])
        if body and not body.endswith(b"\n"):
            raise _BadFrame("body does not end a line")
        return bytes(rest[:wid_len]), session, seq, body

    def _store(self, worker: bytes, session: int, seq: int, body: bytes) -> int:
        """Write the batch unless it was written before: 0, or the errno of the failed write."""
        try:
            text = body.decode()
        except UnicodeDecodeError:
            raise _BadFrame("body is not UTF-8") from None
        lines = [line + "\n" for line in text.split("\n")[:-1]]
        key = (worker, session)
        with self._sink_lock:
            if self._sink_closed:
                return errno.ESHUTDOWN
            last = self._last.get(key)
            if last is not None:
                self._last.move_to_end(key)
                if seq <= last:
                    self.duplicates += 1
                    return 0
            try:
                self._sink.write(lines)
            except OSError as e:
                self.failed += 1
                log.error("audit.collector_write_failed", sink=type(self._sink).__name__, error=e.strerror)
                return e.errno if e.errno and 0 < e.errno < 65536 else errno.EIO
            except Exception:
                # A fault in the sink: the worker keeps the records and retries (never dropped).
                self.failed += 1
                log.exception("audit.collector_write_failed", sink=type(self._sink).__name__)
                return errno.EIO
            self._last[key] = seq
            if len(self._last) > _SESSIONS:
                self._last.popitem(last=False)
            self.written += len(lines)
        return 0

    def _unlink(self) -> None:
        """Remove the socket file when it is still ours (not a later collector's)."""
        with contextlib.suppress(OSError):
            if os.stat(self.socket_path).st_ino == self._inode:
                self.socket_path.unlink()


def _bind(path: Path) -> socket.socket:
    """A listening unix socket at `path`, mode 0600, in a folder only its owner can write to."""
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if folder.stat().st_mode & 0o022:
        # Another user could replace the socket and receive every worker's records.
        raise ListenerError(f"audit collector: {folder} is writable by other users; make it 0700")
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ListenerError(f"audit collector socket {path}: exists and is not a socket")
        if answers(path):
            raise ListenerError(
                f"audit collector socket {path}: another collector answers on it (same state_dir?)"
            )
        path.unlink()  # stale: left by a supervisor that did not stop cleanly
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # created 0600: no moment where another user could connect
    try:
        sock.bind(str(path))
    except OSError as e:
        sock.close()
        raise ListenerError(f"audit collector socket {path}: {e.strerror or e}") from None
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock


def _recv_exact(conn: socket.socket, size: int) -> bytearray | None:
    """Exactly `size` bytes; None when the stream ends first."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = conn.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return buf
