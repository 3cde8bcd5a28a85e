"""Attacks on the gateway's head reading, bounded in time and count, loopback only.

Each runs against a real gateway while a second tenant keeps sending requests through it:
its p99 latency must stay under 1 s and the gateway's resident memory (VmRSS) within
RSS_BOUND of what it was before the attack.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from conftest import OTHER_TOKEN, OTHER_TOKEN_REF, TOKEN, GatewayFactory, RunningGateway, tenant_yaml
from support import RecordingUpstream

pytestmark = pytest.mark.slow

MIB = 1 << 20
RSS_BOUND = 100 * MIB


def rss(gw: RunningGateway) -> int:
    """The gateway process's resident set size, in bytes."""
    for line in Path(f"/proc/{gw.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def two_tenants(upstream: RecordingUpstream) -> dict[str, str]:
    rule = [{"hosts": ["api.test"], "ports": [upstream.port]}]
    return {
        "t1.yaml": tenant_yaml("t1", rule),
        "t2.yaml": tenant_yaml("t2", rule, sandbox="sb2", token_ref=OTHER_TOKEN_REF),
    }


class Victim:
    """The other tenant: one request after another until stopped; latencies and failures kept."""

    def __init__(self, gw: RunningGateway, upstream: RecordingUpstream) -> None:
        self.url = f"{upstream.url_for('api.test')}/victim"
        self.proxy = gw.proxy("sb2", OTHER_TOKEN)
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with httpx.Client(proxy=self.proxy, timeout=10) as c:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    status = c.get(self.url).status_code
                except httpx.HTTPError as e:
                    self.failures.append(repr(e))
                    continue
                self.latencies.append(time.monotonic() - started)
                if status != 200:
                    self.failures.append(f"status {status}")
                time.sleep(0.02)

    def __enter__(self) -> Victim:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(30)

    def assert_served(self, minimum: int) -> None:
        assert self.failures == []
        assert len(self.latencies) >= minimum, len(self.latencies)
        ordered = sorted(self.latencies)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        assert p99 < 1.0, f"p99 {p99:.3f} s over {len(ordered)} requests"


def watch_rss(gw: RunningGateway, stop: threading.Event, peak: list[int]) -> Callable[[], None]:
    def run() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss(gw))
            time.sleep(0.05)

    return run


def test_a_header_flood_is_cut_at_the_cap_while_another_tenant_is_served(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway(two_tenants(http_upstream))
    auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    start = (
        f"GET {http_upstream.url_for('api.test')}/x HTTP/1.1\r\nHost: api.test:{http_upstream.port}\r\n"
        f"Proxy-Authorization: Basic {auth}\r\nX-Flood: "
    ).encode()
    chunk = b"a" * MIB  # one header line that never ends
    budget, deadline = 200 * MIB, time.monotonic() + 15
    sent, connections = 0, 0
    baseline, peak = rss(gw), [0]
    stop_watch = threading.Event()
    watcher = threading.Thread(target=watch_rss(gw, stop_watch, peak))
    watcher.start()
    try:
        with Victim(gw, http_upstream) as victim:
            time.sleep(0.5)
            while sent < budget and time.monotonic() < deadline:
                connections += 1
                with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
                    try:
                        sock.sendall(start)
                        while sent < budget and time.monotonic() < deadline:
                            sock.sendall(chunk)
                            sent += len(chunk)
                    except OSError:
                        pass  # cut by the gateway: the attacker reconnects
                time.sleep(0.05)
            time.sleep(0.5)
        victim.assert_served(minimum=10)
    finally:
        stop_watch.set()
        watcher.join()
    assert peak[0] - baseline < RSS_BOUND, f"RSS grew {(peak[0] - baseline) / MIB:.0f} MiB"
    # Every cut connection was refused once, in the audit trail too.
    refused = [r for r in gw.records(event="decision") if r["reason"] == "header_too_large"]
    assert connections > 1
    assert len(refused) >= connections - 1
    assert all(r["tenant"] is None and r["status"] == 431 for r in refused)
    assert not [r for r in http_upstream.requests if r.target.endswith("/x")]


def test_slowloris_heads_are_closed_at_the_timeout_while_another_tenant_is_served(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    timeout, count = 3.0, 50
    gw = start_gateway(
        two_tenants(http_upstream), config={"heads": {"read_timeout_seconds": timeout}}
    )
    auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    start = (
        f"GET {http_upstream.url_for('api.test')}/slow HTTP/1.1\r\nHost: api.test:{http_upstream.port}\r\n"
        f"Proxy-Authorization: Basic {auth}\r\nX-Slow: "
    ).encode()
    baseline, peak = rss(gw), [0]
    socks = [socket.create_connection(("127.0.0.1", gw.port), timeout=10) for _ in range(count)]
    closed_after: dict[int, float] = {}
    answers: dict[int, bytes] = {}
    stop_watch = threading.Event()
    watcher = threading.Thread(target=watch_rss(gw, stop_watch, peak))
    watcher.start()
    try:
        with Victim(gw, http_upstream) as victim:
            began = time.monotonic()
            for sock in socks:
                sock.sendall(start)
                sock.setblocking(False)
            # One more header byte per second on every connection, until each is closed.
            while len(closed_after) < count and time.monotonic() - began < timeout + 6:
                for i, sock in enumerate(socks):
                    if i in closed_after:
                        continue
                    try:
                        data = sock.recv(65536)
                        answers[i] = answers.get(i, b"") + data
                        if not data:
                            closed_after[i] = time.monotonic() - began
                            continue
                    except BlockingIOError:
                        pass
                    except OSError:
                        closed_after[i] = time.monotonic() - began
                        continue
                    with contextlib.suppress(OSError):
                        sock.send(b"a")
                time.sleep(1.0 if len(closed_after) == 0 and time.monotonic() - began < timeout - 1 else 0.1)
        victim.assert_served(minimum=10)
    finally:
        stop_watch.set()
        watcher.join()
        for sock in socks:
            sock.close()
    assert len(closed_after) == count, f"{count - len(closed_after)} half-sent heads still open"
    assert all(timeout - 0.5 < t < timeout + 5 for t in closed_after.values()), sorted(closed_after.values())
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers.values())
    assert peak[0] - baseline < RSS_BOUND
    timed_out = [r for r in gw.records(count) if r["reason"] == "header_timeout"]
    assert len(timed_out) == count
    assert not [r for r in http_upstream.requests if r.target.endswith("/slow")]
