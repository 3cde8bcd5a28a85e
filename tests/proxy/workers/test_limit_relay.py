"""The workers' limit relay: a real private redis-server on a unix socket, restarted when it dies."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from sandgate.proxy.workers.limit_relay import LimitRelay, LimitRelayError


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting to be reaped does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def tcp_sockets(pid: int) -> list[str]:
    """The TCP sockets (listening or not) process `pid` holds, as `ss` shows them."""
    out = subprocess.run(["ss", "-Hantp"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if f"pid={pid}," in line]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LimitRelay]:
    with LimitRelay(tmp_path / "workers") as b:
        yield b


def client(b: LimitRelay) -> redis.Redis:
    return redis.Redis.from_url(b.url, socket_timeout=2)


def test_it_answers_on_a_private_socket_and_listens_on_no_tcp_port(broker: LimitRelay) -> None:
    c = client(broker)
    assert c.ping()
    assert c.incrby("k", 3) == 3
    c.close()
    assert broker.url == f"unix://{broker.folder / 'limits.sock'}"
    assert stat.S_IMODE(broker.folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(broker.socket.stat().st_mode) == 0o700
    assert broker.pid is not None
    assert tcp_sockets(broker.pid) == []


def test_a_killed_broker_is_restarted_empty_on_the_same_socket(broker: LimitRelay) -> None:
    c = client(broker)
    c.set("k", "1")
    old = broker.pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while broker.restarts < 1 or broker.pid in (None, old):
        assert time.monotonic() < deadline, "the watchdog did not restart the broker"
        time.sleep(0.02)
    # Counts start again from zero: the restarted server holds nothing.
    assert c.get("k") is None
    c.close()


def test_stop_ends_the_server_and_removes_its_socket(tmp_path: Path) -> None:
    b = LimitRelay(tmp_path / "workers").start()
    pid = b.pid
    assert pid is not None
    b.stop()
    assert not b.socket.exists()
    assert not alive(pid)
    assert b.restarts == 0


def test_a_broker_left_by_a_killed_supervisor_is_stopped_before_a_new_one_starts(tmp_path: Path) -> None:
    first = LimitRelay(tmp_path / "workers").start()
    stale = first.pid
    assert stale is not None
    # As if its supervisor died: the watchdog is gone, the server still runs.
    first._stopping.set()
    with LimitRelay(tmp_path / "workers") as second:
        deadline = time.monotonic() + 5
        while alive(stale):
            assert time.monotonic() < deadline, "the stale broker still runs"
            time.sleep(0.02)
        assert second.pid not in (None, stale)
        assert client(second).ping()
    first._process = None
    first.stop()


def test_without_redis_server_the_error_says_what_to_do(tmp_path: Path) -> None:
    b = LimitRelay(tmp_path / "workers")
    b.binary = None
    with pytest.raises(LimitRelayError, match=r"workers > 1 need redis-server .* or set workers: 1"):
        b.start()


def test_a_socket_path_too_long_for_unix_sockets_is_refused_by_name(tmp_path: Path) -> None:
    folder = tmp_path / ("x" * 100)
    with pytest.raises(LimitRelayError, match="longer than 107 bytes; use a shorter state_dir"):
        LimitRelay(folder).start()
