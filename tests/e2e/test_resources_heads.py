"""Attacks on the gateway's head reading, bounded in time and count, loopback only.

Each runs against a real gateway while a second tenant keeps sending requests through it:
its p99 latency must stay under 1 s and the gateway's resident memory (VmRSS) within
RSS_BOUND of what it was before the attack.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import httpx
import hyperframe.frame
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
    def too_large(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r["reason"] == "header_too_large"]

    refused = too_large(gw.records_until(lambda rs: len(too_large(rs)) >= connections - 1))
    assert connections > 1
    assert len(refused) >= connections - 1
    assert all(r["tenant"] is None and r["status"] == 431 for r in refused)
    assert not [r for r in http_upstream.requests if r.target.endswith("/x")]


def test_slowloris_heads_are_closed_at_the_timeout_while_another_tenant_is_served(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    timeout, count = 3.0, 50
    gw = start_gateway(two_tenants(http_upstream), config={"heads": {"read_timeout_seconds": timeout}})
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


# -- HTTP/2 header blocks on intercepted tunnels -------------------------------------------------


def h2_tunnel(gw: RunningGateway, port: int) -> tuple[ssl.SSLSocket, h2.connection.H2Connection]:
    """An h2 connection to api.test through a CONNECT tunnel the gateway intercepts."""
    auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    sock.sendall(
        f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    ctx = ssl.create_default_context(cafile=str(gw.ca_file))
    ctx.set_alpn_protocols(["h2"])
    tls = ctx.wrap_socket(sock, server_hostname="api.test")
    assert tls.selected_alpn_protocol() == "h2"
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    tls.sendall(conn.data_to_send())
    return tls, conn


def until_closed(tls: ssl.SSLSocket, conn: h2.connection.H2Connection) -> list[h2.events.Event]:
    """Every h2 event the gateway sends until it closes the connection (a reset included:
    the close can overtake a GOAWAY while the client is still sending)."""
    seen: list[h2.events.Event] = []
    try:
        while data := tls.recv(65536):
            seen += conn.receive_data(data)
            if pending := conn.data_to_send():
                tls.sendall(pending)
    except TimeoutError:
        raise AssertionError("the gateway kept the h2 connection open") from None
    except (OSError, h2.exceptions.ProtocolError):
        pass
    return seen


def test_h2_header_blocks_over_the_cap_end_the_connection_while_another_tenant_is_served(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, https_upstream: RecordingUpstream
) -> None:
    tenants = two_tenants(http_upstream)
    tenants["t1.yaml"] = tenant_yaml(
        "t1", [{"hosts": ["api.test"], "ports": [https_upstream.port], "inspect": True}]
    )
    gw = start_gateway(tenants)
    port = https_upstream.port
    baseline, peak = rss(gw), [0]
    stop_watch = threading.Event()
    watcher = threading.Thread(target=watch_rss(gw, stop_watch, peak))
    watcher.start()
    attempts = 0
    try:
        with Victim(gw, http_upstream) as victim:
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline or attempts < 4:
                tls, conn = h2_tunnel(gw, port)
                with tls:
                    if attempts == 0:
                        # The gateway tells clients its cap.
                        until_first_settings(tls, conn)
                        assert conn.remote_settings.max_header_list_size == 65536
                    if attempts % 2 == 0:
                        # One header of 200 KiB: HEADERS plus CONTINUATION frames, decoded over the cap.
                        headers = [
                            (":method", "GET"),
                            (":scheme", "https"),
                            (":authority", "api.test"),
                            (":path", "/h2"),
                        ]
                        conn.send_headers(1, [*headers, ("x-big", "a" * 200_000)], end_stream=True)
                    else:
                        # A CONTINUATION flood: 16 MiB of header block that never ends.
                        frames: list[hyperframe.frame.Frame] = [
                            hyperframe.frame.HeadersFrame(1, data=b"\x00" * 16_000)
                        ]
                        frames += [
                            hyperframe.frame.ContinuationFrame(1, data=b"\x00" * 16_000) for _ in range(1000)
                        ]
                        conn.data_to_send()
                    try:
                        if attempts % 2 == 0:
                            tls.sendall(conn.data_to_send())
                        else:
                            for frame in frames:
                                tls.sendall(frame.serialize())
                    except OSError:
                        pass
                    seen = until_closed(tls, conn)
                    if attempts % 2 == 0:
                        assert any(isinstance(e, h2.events.ConnectionTerminated) for e in seen), seen
                attempts += 1
        victim.assert_served(minimum=10)
    finally:
        stop_watch.set()
        watcher.join()
    assert peak[0] - baseline < RSS_BOUND
    refused = [r for r in gw.records(attempts) if r["reason"] == "header_too_large"]
    assert len(refused) == attempts
    assert all((r["tenant"], r["sandbox"], r["dest"]["host"]) == ("t1", "sb1", "api.test") for r in refused)
    assert https_upstream.requests == []


def until_first_settings(tls: ssl.SSLSocket, conn: h2.connection.H2Connection) -> list[h2.events.Event]:
    """Read until the gateway's SETTINGS arrived."""
    seen: list[h2.events.Event] = []
    while not any(isinstance(e, h2.events.RemoteSettingsChanged) for e in seen):
        data = tls.recv(65536)
        assert data, "closed before SETTINGS"
        seen += conn.receive_data(data)
    tls.sendall(conn.data_to_send())
    return seen


# -- bytes held behind a pending decision ------------------------------------------------------


def test_bytes_sent_behind_a_slow_decision_are_not_read_into_memory(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    # A nameserver that never answers: the decision on slow.test waits the resolver's timeout.
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    tenants = two_tenants(http_upstream)
    tenants["t1.yaml"] = tenant_yaml("t1", [{"hosts": ["slow.test"], "ports": [80]}])
    resolver = {"nameservers": [f"127.0.0.1:{silent.getsockname()[1]}"], "timeout": 4.0}
    gw = start_gateway(tenants, config={"resolver": resolver})
    auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    # A body the gateway reads while it waits for the lookup that decides the request.
    head = (
        f"POST http://slow.test/x HTTP/1.1\r\nHost: slow.test\r\nProxy-Authorization: Basic {auth}\r\n"
        f"Content-Length: {1 << 30}\r\n\r\n"
    )
    junk = b"b" * MIB
    baseline, peak = rss(gw), [0]
    stop_watch = threading.Event()
    watcher = threading.Thread(target=watch_rss(gw, stop_watch, peak))
    watcher.start()
    sent = 0
    try:
        with Victim(gw, http_upstream) as victim, socket.create_connection(("127.0.0.1", gw.port)) as sock:
            sock.sendall(head.encode())
            sock.settimeout(0.5)
            deadline = time.monotonic() + 3.5  # within the lookup's wait
            while time.monotonic() < deadline and sent < 400 * MIB:
                try:
                    sent += sock.send(junk)
                except TimeoutError:
                    pass  # the gateway stopped reading: flow control holds the sender
                except OSError:
                    break
        victim.assert_served(minimum=10)
    finally:
        stop_watch.set()
        watcher.join()
        silent.close()
    assert peak[0] - baseline < RSS_BOUND, (
        f"RSS grew {(peak[0] - baseline) / MIB:.0f} MiB ({sent / MIB:.0f} MiB sent)"
    )
    assert sent < 64 * MIB, f"{sent / MIB:.0f} MiB were taken in while the decision was pending"
