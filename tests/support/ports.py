"""Loopback ports for test servers."""

from __future__ import annotations

import socket
import time

__all__ = ["free_port", "wait_for_port"]


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
