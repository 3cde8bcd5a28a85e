"""Tunnels through a gateway's explicit listener, for the tests of the passthrough front."""

from __future__ import annotations

import base64
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["counters", "https_get", "lean_counters", "open_tunnel", "read_head", "read_until", "tls_tunnel"]

# The token conftest's tenants give sandbox sb1 (kept in step with tests/conftest.py).
TOKEN = "test-token-0123456789abcdef"


class Gateway(Protocol):
    """What these helpers need of conftest's RunningGateway."""

    port: int
    root: Path

    @property
    def ca_file(self) -> Path: ...


def counters(gw: Gateway) -> tuple[float, float]:
    """(tunnels the front spliced, connections it handed to mitmproxy) so far."""
    transport = httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock"))
    with httpx.Client(transport=transport, base_url="http://sandgate") as c:
        text = c.get("/metrics").raise_for_status().text
    values = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}
    return values["sandgate_front_tunnels_total"], values["sandgate_front_handoffs_total"]


def lean_counters(gw: Gateway) -> dict[str, float]:
    """The lean HTTP/1.1 layer's counters so far, by name (a label's value appended: `name:value`)."""
    transport = httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock"))
    with httpx.Client(transport=transport, base_url="http://sandgate") as c:
        text = c.get("/metrics").raise_for_status().text
    return {
        s.name + "".join(f":{v}" for v in s.labels.values()): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("sandgate_http1_lean_") and s.name.endswith("_total")
    }


def tls_tunnel(gw: Gateway, port: int, *, host: str = "api.test", timeout: float = 10.0) -> ssl.SSLSocket:
    """TLS to `host` (trusting the gateway's CA) in a tunnel to host:port through the gateway."""
    context = ssl.create_default_context(cafile=str(gw.ca_file))
    tls = context.wrap_socket(open_tunnel(gw, f"{host}:{port}"), server_hostname=host)
    tls.settimeout(timeout)
    return tls


def read_until(tls: ssl.SSLSocket, done: Callable[[bytes], bool]) -> bytes:
    """What `tls` sends until `done` says it is all there, or it closes, fails or times out."""
    data = b""
    while not done(data):
        try:
            chunk = tls.recv(65536)
        except (TimeoutError, ConnectionError, ssl.SSLError):
            break
        if not chunk:
            break
        data += chunk
    return data


def open_tunnel(gw: Gateway, target: str, *, token: str = TOKEN, head_in: int = 1) -> socket.socket:
    """A CONNECT through the gateway, answered 200 (the head sent in `head_in` pieces)."""
    auth = base64.b64encode(f"sb1:{token}".encode()).decode()
    head = (
        f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
    )
    raw = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    step = -(-len(head) // head_in)
    for i in range(0, len(head), step):
        raw.sendall(head[i : i + step])
        if head_in > 1:
            time.sleep(0.4)
    answer = read_head(raw)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    return raw


def read_head(raw: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = raw.recv(1)
        if not chunk:
            break
        data += chunk
    return data


def https_get(raw: socket.socket, host: str, cafile: str, path: str = "/front") -> bytes:
    """GET over TLS in the tunnel (SNI `host`), the whole response."""
    ctx = ssl.create_default_context(cafile=cafile)
    with ctx.wrap_socket(raw, server_hostname=host) as tls:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
        return data
