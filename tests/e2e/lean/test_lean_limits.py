"""The lean layer under a bounded attack: what a guest sends while its request waits for a
decision (an approval) is not read into memory, and pipelined bytes over the head cap close its
connection; another tenant is served throughout.

A request held for approval makes the lean layer wait through one hook: its connection's later
bytes queue under the same back-pressure bound as on the general path (`connections.max_held_bytes`).
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import OTHER_TOKEN, OTHER_TOKEN_REF, TOKEN_REF, GatewayFactory, RunningGateway
from support import RecordingUpstream, TestPKI
from support.tunnels import tls_tunnel

pytestmark = pytest.mark.slow

UPSTREAM_IP = "127.0.0.2"
MIB = 1 << 20


def _tenants(port: int) -> dict[str, str]:
    allow = [{"hosts": ["api.test"], "ports": [port], "inspect": True}]
    held = {
        "tenant": "t1",
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
        # The tunnel is allowed and inspected; a request for /held/ waits for a person.
        "allow": [{**allow[0], "paths": ["/first", "/second"]}],
        "ask": [{"id": "held", "hosts": ["api.test"], "ports": [port], "paths": ["/held/**"]}],
    }
    other = {"tenant": "t2", "sandboxes": [{"id": "sb2", "token": OTHER_TOKEN_REF}], "allow": allow}
    return {
        "t1.yaml": yaml.safe_dump(held, sort_keys=False),
        "t2.yaml": yaml.safe_dump(other, sort_keys=False),
    }


def _rss(gw: RunningGateway) -> int:
    for line in Path(f"/proc/{gw.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Other:
    """Tenant t2: intercepted requests one after another, in a thread, until stopped."""

    def __init__(self, gw: RunningGateway, port: int) -> None:
        self.url = f"https://api.test:{port}/other"
        self.proxy = gw.proxy("sb2", OTHER_TOKEN)
        self.verify = ssl.create_default_context(cafile=str(gw.ca_file))
        self.served = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Other:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(proxy=self.proxy, verify=self.verify, timeout=5) as client:
            while not self._stop.is_set():
                try:
                    if client.get(self.url).status_code == 200:
                        self.served += 1
                except httpx.HTTPError as e:
                    self.failed.append(repr(e))
                time.sleep(0.02)


@pytest.fixture(params=["lean", "general"])
def lab(
    start_gateway: GatewayFactory, pki: TestPKI, request: pytest.FixtureRequest
) -> Iterator[tuple[RunningGateway, RecordingUpstream]]:
    with RecordingUpstream(UPSTREAM_IP, tls=pki, name="lean-limits") as up:
        gw = start_gateway(_tenants(up.port), config={"interception": {"http1_path": request.param}})
        yield gw, up


def test_a_body_sent_behind_a_held_request_is_not_read_into_memory(
    lab: tuple[RunningGateway, RecordingUpstream],
) -> None:
    gw, up = lab
    baseline, peak, sent = _rss(gw), 0, 0
    with Other(gw, up.port) as other, tls_tunnel(gw, up.port) as tls:
        # Over stream_large_bodies: the body streams once decided; it waits for the approval.
        tls.sendall(
            f"POST /held/upload HTTP/1.1\r\nHost: api.test\r\nContent-Length: {1 << 30}\r\n\r\n".encode()
        )
        tls.settimeout(0.5)
        junk = b"b" * MIB
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and sent < 400 * MIB:
            with contextlib.suppress(TimeoutError):  # the gateway stopped reading: TCP holds the sender
                sent += tls.send(junk)
            peak = max(peak, _rss(gw))
    assert sent < 64 * MIB, f"{sent / MIB:.0f} MiB were taken in while the request was held"
    assert peak - baseline < 100 * MIB, f"RSS grew {(peak - baseline) / MIB:.0f} MiB"
    assert other.served >= 10 and not other.failed, (other.served, other.failed[:3])
    assert [r for r in up.requests if r.target.startswith("/held")] == [], "nothing undecided went upstream"
    held = [r for r in gw.records() if r.get("path") == "/held/upload"]
    assert [(r["decision"], r["reason"]) for r in held] == [("ask", "approval_required")]


def test_pipelined_bytes_over_the_head_cap_close_the_connection_and_are_never_forwarded(
    start_gateway: GatewayFactory, pki: TestPKI
) -> None:
    with RecordingUpstream(UPSTREAM_IP, tls=pki, name="lean-slow", delay=1.0) as slow:
        gw = start_gateway(_tenants(slow.port), config={"interception": {"http1_path": "lean"}})
        with Other(gw, slow.port) as other, tls_tunnel(gw, slow.port) as tls:
            tls.sendall(b"GET /first HTTP/1.1\r\nHost: api.test\r\n\r\n")
            time.sleep(0.3)  # the first is upstream, its answer pending
            tls.sendall(b"GET /second HTTP/1.1\r\nHost: api.test\r\nX-Big: " + b"a" * 200_000)
            tls.settimeout(10)
            data = b""
            try:
                while chunk := tls.recv(65536):
                    data += chunk
            except (ConnectionError, ssl.SSLError):
                pass
            time.sleep(1.5)  # the other tenant's requests wait on the slow upstream too
        assert b"X-Big" not in data
        assert [r.target for r in slow.requests if r.target != "/other"] == ["/first"]
        refusals = [
            r for r in gw.records_until(lambda rs: any(r["reason"] == "header_too_large" for r in rs))
        ]
        (refusal,) = [r for r in refusals if r["reason"] == "header_too_large"]
        assert (refusal["tenant"], refusal["status"]) == ("t1", None), "closed: a response was pending"
        assert other.served >= 1 and not other.failed, (other.served, other.failed[:3])
