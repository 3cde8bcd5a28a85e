"""Loopback ports for test servers."""

from __future__ import annotations

import errno
import os
import random
import socket
import time
from pathlib import Path

__all__ = ["free_port", "free_port_run", "wait_for_port"]


def _below_ephemeral() -> tuple[int, int]:
    """Ports below the kernel's ephemeral range (32768 and up by default), where no client's
    outgoing connection takes one between the check and the bind; where that range starts
    low (some container hosts: 1024), the range above 20000 all the same."""
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first = 32768
    return 20000, first - 768 if first >= 24000 else 32000


_LOWEST, _HIGHEST = _below_ephemeral()
# A port handed out is not handed out again by this process for this long: its server may
# not have bound it yet.
_HANDED_HOLD_SECONDS = 300.0
_handed: dict[int, float] = {}


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _band() -> tuple[int, int]:
    """This pytest-xdist worker's own slice of the range: two workers never draw the same
    port (one had a gateway lose its port to the other's, and its tests talked to that one)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = (_HIGHEST - _LOWEST) // max(count, 1)
    low = _LOWEST + width * min(index, count - 1)
    return low, low + width


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on `host` that was free a moment ago.

    Prefer letting a server bind port 0 itself; use this only for a process that must
    be given its port on the command line.
    """
    return free_port_run(1, host)


def free_port_run(count: int, host: str = "0.0.0.0") -> int:
    """The first of `count` consecutive ports free for TCP and UDP on `host` a moment ago.

    Drawn below the ephemeral range, in this test worker's own band, and never one this
    process handed out in the last few minutes: for a gateway with workers, whose worker i
    listens on base + i, as for any server given its port on the command line.
    """
    low, high = _band()
    now = time.monotonic()
    for port, when in list(_handed.items()):
        if now - when > _HANDED_HOLD_SECONDS:
            del _handed[port]
    for _ in range(500):
        first = random.randrange(low, high - count)
        ports = range(first, first + count)
        if any(port in _handed for port in ports) or not _bindable(host, ports):
            continue
        _handed.update(dict.fromkeys(ports, now))
        return first
    raise RuntimeError(f"no {count} consecutive free ports on {host} in {low}-{high}")


def _bindable(host: str, ports: range) -> bool:
    held: list[socket.socket] = []
    try:
        for port in ports:
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                sock = socket.socket(_family(host), kind)
                held.append(sock)
                sock.bind((host, port))
        return True
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            return False  # taken (or reserved): another port
        raise  # the host cannot be bound at all: say so, not "no free ports"
    finally:
        for sock in held:
            sock.close()


def wait_for_port(host: str, port: int, timeout: float = 5.0) -> None:
    """Block until a TCP connect to (host, port) succeeds; TimeoutError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s") from e
            time.sleep(0.02)
