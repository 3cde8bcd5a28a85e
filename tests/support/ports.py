"""Loopback ports for test servers."""

from __future__ import annotations

import random
import socket
import time

__all__ = ["free_port", "free_port_run", "wait_for_port"]


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on `host` that was free a moment ago (bind to port 0, then release).

    Prefer letting a server bind port 0 itself; use this only for a process that must
    be given its port on the command line.
    """
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def free_port_run(count: int, host: str = "0.0.0.0") -> int:
    """The first of `count` consecutive ports free for TCP and UDP on `host` a moment ago.

    Drawn below the kernel's ephemeral range (32768 and up by default), where no client's
    outgoing connection takes one between the check and the bind: for a gateway with workers,
    whose worker i listens on base + i.
    """
    for _ in range(500):
        first = random.randrange(20000, 32000 - count)
        held: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                    sock = socket.socket(_family(host), kind)
                    held.append(sock)
                    sock.bind((host, port))
            return first
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports on {host}")


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
