"""The supervisor's audit collector: one writer for every worker, each batch once, bad peers cut off."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sandgate.proxy.audit.collector import AuditCollector
from sandgate.proxy.audit.forward import MAGIC, MAX_BODY, REPLY, REQUEST, ForwardSink
from sandgate.proxy.audit.trail import JsonlFileSink
from sandgate.proxy.errors import ListenerError

# A worker process: `batches` batches of `size` records through a ForwardSink, retried like
# AuditLog does; prints "ready" after its first batch is acknowledged. With a `go` path it
# starts sending when that file exists (so that several start together).
FORWARDER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from sandgate.proxy.audit.forward import ForwardSink

    sock, worker, batches, size, pad = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    sink = ForwardSink(Path(sock), worker)
    go = Path(sys.argv[6]) if len(sys.argv) > 6 else None
    if go is not None:
        print("waiting", flush=True)
    while go is not None and not go.exists():
        time.sleep(0.005)
    n = 0
    for b in range(batches):
        lines = [json.dumps({"w": worker, "n": n + i, "pad": "x" * pad}) + "\\n" for i in range(size)]
        while True:
            try:
                sink.write(lines)
                break
            except OSError:
                time.sleep(0.05)
        n += size
        if b == 0:
            print("ready", flush=True)
    sink.close()
    """
)


def _records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _numbers_of(records: list[dict[str, object]], worker: str) -> list[object]:
    return [r["n"] for r in records if r["w"] == worker]


def _forwarder(
    sock: Path, worker: str, batches: int, size: int, pad: int = 100, go: Path | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", FORWARDER, str(sock), worker, str(batches), str(size), str(pad)]
        + ([str(go)] if go else []),
        stdout=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 60) -> int:
    """The forwarder's exit code once it ends."""
    code = proc.wait(timeout)
    if proc.stdout is not None:
        proc.stdout.close()
    return code


def test_batches_from_three_concurrent_workers_land_once_each_in_order(
    tmp_path: Path, sock: Path, collector: AuditCollector
) -> None:
    go = tmp_path / "go"
    workers = {f"w{i}": _forwarder(sock, f"w{i}", batches=200, size=25, go=go) for i in range(3)}
    for proc in workers.values():
        assert proc.stdout is not None and proc.stdout.readline().strip() == "waiting"
    go.touch()
    for proc in workers.values():
        assert _finish(proc) == 0
    records = _records(tmp_path / "audit.jsonl")
    assert len(records) == collector.written == 3 * 200 * 25
    for worker in workers:
        assert _numbers_of(records, worker) == list(range(5000))
    # However the scheduler interleaved them, a batch is never split: each run of one
    # worker's records is whole batches.
    runs = [len(list(run)) for _, run in itertools.groupby(r["w"] for r in records)]
    assert all(n % 25 == 0 for n in runs), runs


def test_a_worker_killed_mid_stream_leaves_the_other_workers_records_intact(
    tmp_path: Path, sock: Path, collector: AuditCollector
) -> None:
    # Big batches (~400 KB a frame, more than a socket buffer): the kill most likely cuts one.
    doomed = _forwarder(sock, "w0", batches=10_000, size=200, pad=2000)
    steady = _forwarder(sock, "w1", batches=300, size=20)
    assert doomed.stdout is not None and doomed.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    doomed.send_signal(signal.SIGKILL)
    _finish(doomed, 10)
    assert _finish(steady) == 0
    # A worker that takes the dead one's place is served as well.
    assert _finish(_forwarder(sock, "w0", batches=3, size=5)) == 0
    records = _records(tmp_path / "audit.jsonl")  # every line whole JSON
    assert _numbers_of(records, "w1") == list(range(6000))
    dead = _numbers_of(records, "w0")
    killed = len(dead) - 15
    assert killed >= 200 and killed % 200 == 0, "whole batches of the killed worker only"
    assert dead == list(range(killed)) + list(range(15))
    assert collector.bad_frames == 0


def _raw(sock: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(sock))
    return s


def _closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(
    "frame",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        REQUEST.pack(MAGIC, 2, 1, 1, MAX_BODY + 1) + b"w9",
        REQUEST.pack(MAGIC, 0, 1, 1, 2) + b"{}",
        REQUEST.pack(MAGIC, 2, 1, 1, 6) + b"w9" + b"{}\n{}x",
        REQUEST.pack(MAGIC, 2, 1, 1, 3) + b"w9" + b"\xff\xfe\n",
    ],
    ids=[
        "garbage closes that connection",
        "a body over the limit closes that connection before it is read",
        "an empty worker id closes that connection",
        "a body that does not end a line closes that connection",
        "a body that is not UTF-8 closes that connection",
    ],
)
def test_a_bad_frame_closes_only_its_own_connection(
    tmp_path: Path, sock: Path, collector: AuditCollector, frame: bytes
) -> None:
    good = ForwardSink(sock, "w1")
    good.write(['{"w":"w1","n":0}\n'])
    bad = _raw(sock)
    bad.sendall(frame)
    assert _closed_by_peer(bad)
    bad.close()
    good.write(['{"w":"w1","n":1}\n'])  # on the connection it already had
    assert good.failures == 0
    good.close()
    assert _numbers_of(_records(tmp_path / "audit.jsonl"), "w1") == [0, 1]
    assert collector.bad_frames == 1


def test_a_frame_cut_by_its_sender_is_not_written(
    tmp_path: Path, sock: Path, collector: AuditCollector
) -> None:
    body = b'{"w":"w9","n":0}\n{"w":"w9","n":1}\n'
    cut = _raw(sock)
    cut.sendall(REQUEST.pack(MAGIC, 2, 7, 1, len(body)) + b"w9" + body[:20])
    cut.close()
    whole = _raw(sock)
    whole.sendall(REQUEST.pack(MAGIC, 2, 7, 1, len(body)) + b"w9" + body)
    assert REPLY.unpack(whole.recv(REPLY.size)) == (MAGIC, 0, 1)
    whole.close()
    assert _numbers_of(_records(tmp_path / "audit.jsonl"), "w9") == [0, 1]


def test_the_socket_is_0600_in_a_0700_folder(sock: Path, collector: AuditCollector) -> None:
    assert sock.stat().st_mode & 0o777 == 0o600
    assert sock.parent.stat().st_mode & 0o777 == 0o700


def test_a_second_collector_on_a_live_socket_is_refused(
    tmp_path: Path, sock: Path, collector: AuditCollector
) -> None:
    other = AuditCollector(sock, JsonlFileSink(tmp_path / "other.jsonl", max_bytes=10**9, backups=1))
    with pytest.raises(ListenerError, match="another collector answers"):
        other.start()
    # The first one still serves.
    sink = ForwardSink(sock, "w1")
    sink.write(['{"w":"w1","n":0}\n'])
    sink.close()


def test_a_stale_socket_is_replaced_and_removed_on_close(tmp_path: Path, sock: Path) -> None:
    sock.parent.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))  # bound, never listening: what a killed supervisor leaves
    stale.close()
    collector = AuditCollector(sock, JsonlFileSink(tmp_path / "audit.jsonl", max_bytes=10**9, backups=1))
    collector.start()
    sink = ForwardSink(sock, "w1")
    sink.write(['{"w":"w1","n":0}\n'])
    sink.close()
    collector.close()
    assert not sock.exists()
    assert _numbers_of(_records(tmp_path / "audit.jsonl"), "w1") == [0]


def test_a_path_that_is_not_a_socket_is_refused(tmp_path: Path, sock: Path) -> None:
    sock.parent.mkdir(mode=0o700)
    sock.write_text("not a socket")
    collector = AuditCollector(sock, JsonlFileSink(tmp_path / "audit.jsonl", max_bytes=10**9, backups=1))
    with pytest.raises(ListenerError, match="not a socket"):
        collector.start()
    assert sock.read_text() == "not a socket"


def test_a_folder_other_users_can_write_to_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, 0o777)
    collector = AuditCollector(
        folder / "audit.sock", JsonlFileSink(tmp_path / "audit.jsonl", max_bytes=10**9, backups=1)
    )
    with pytest.raises(ListenerError, match="writable by other users"):
        collector.start()


def test_close_cuts_connections_and_closes_the_sink(tmp_path: Path, sock: Path) -> None:
    path = tmp_path / "audit.jsonl"
    collector = AuditCollector(sock, JsonlFileSink(path, max_bytes=10**9, backups=1))
    collector.start()
    idle = _raw(sock)
    sink = ForwardSink(sock, "w1", timeout=1)
    sink.write(['{"w":"w1","n":0}\n'])
    started = time.monotonic()
    collector.close()
    assert time.monotonic() - started < 2, "idle connections do not hold close()"
    assert _closed_by_peer(idle)
    idle.close()
    with pytest.raises(ConnectionError):
        sink.write(['{"w":"w1","n":1}\n'])
    sink.close()
    assert _numbers_of(_records(path), "w1") == [0]
