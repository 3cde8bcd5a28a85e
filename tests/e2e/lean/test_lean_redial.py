"""A kept-alive upstream that closes while a request on the same tunnel is held for approval, on
both paths: the approved request goes over a new upstream connection and is answered; a new
connection that cannot be made (refused, or its certificate not trusted) is the exchange's 502,
recorded once, and nothing hangs. A request the lean layer hands to the general path after it
dialled again is served there."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SANDGATE, TOKEN_REF, GatewayFactory, RunningGateway
from support import TestPKI
from support.tunnels import lean_counters, read_until, tls_tunnel

pytestmark = pytest.mark.slow

UPSTREAM_IP = "127.0.0.2"
IDLE = 0.5  # the upstream's keep-alive idle timeout, in seconds
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def _tenant(port: int) -> str:
    allow = {"hosts": ["api.test"], "ports": [port], "inspect": True}
    doc = {
        "tenant": "t1",
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
        "allow": [{**allow, "paths": ["/first", "/third"]}],
        "ask": [{"id": "held", "hosts": ["api.test"], "ports": [port], "paths": ["/held/**"]}],
    }
    return yaml.safe_dump(doc, sort_keys=False)


class IdleUpstream:
    """A TLS upstream answering `OK` to each request (head and Content-Length body), which
    closes a kept-alive connection idle for `idle` s; records each head with the number of its
    connection, and each body's length."""

    def __init__(self, pki: TestPKI, idle: float = IDLE) -> None:
        self.context = pki.server_context()
        self.idle = idle
        self.listener = socket.create_server((UPSTREAM_IP, 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests: list[tuple[int, bytes]] = []
        self.bodies: list[int] = []
        self.idle_closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> IdleUpstream:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop_listening()

    def stop_listening(self) -> None:
        """Later connections are refused (shutdown wakes the blocked accept)."""
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(raw, self.connections), daemon=True).start()

    def _one(self, raw: socket.socket, number: int) -> None:
        try:
            with self.context.wrap_socket(raw, server_side=True) as tls:
                tls.settimeout(self.idle)
                data = b""
                while True:
                    try:
                        chunk = tls.recv(65536)
                    except TimeoutError:
                        self.idle_closed.set()
                        return
                    if not chunk:
                        return
                    data += chunk
                    while b"\r\n\r\n" in data:
                        head, _, rest = data.partition(b"\r\n\r\n")
                        size = _content_length(head)
                        if len(rest) < size:
                            break  # the body is still coming
                        data = rest[size:]
                        self.requests.append((number, head))
                        self.bodies.append(size)
                        tls.sendall(OK)
        except (OSError, ssl.SSLError):
            return


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _sandgate(gw: RunningGateway, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, *args, "--config", str(gw.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=30,
    )


def _held(gw: RunningGateway, timeout: float = 15.0) -> str:
    """The id of the one request the gateway holds, once it holds it."""
    deadline = time.monotonic() + timeout
    while True:
        out = _sandgate(gw, "requests", "list", "--format", "json")
        assert out.returncode == 0, out.stderr
        found = [r["id"] for r in json.loads(out.stdout)["requests"] if r["state"] == "held"]
        if found:
            return str(found[0])
        assert time.monotonic() < deadline, "no request was held"
        time.sleep(0.1)


def _ok(data: bytes) -> bool:
    return data.endswith(b"\r\n\r\nok")


def _hold_past_the_upstreams_close(
    gw: RunningGateway,
    up: IdleUpstream,
    tls: ssl.SSLSocket,
    meanwhile: Callable[[], None] = lambda: None,
    *,
    held_head: bytes = b"GET /held/x HTTP/1.1\r\nHost: api.test\r\n\r\n",
    body: bytes = b"",
) -> bytes:
    """/first answered; `held_head` held until the upstream closed the idle connection (and
    `meanwhile` ran), then approved (and its `body` sent): its answer."""
    tls.sendall(b"GET /first HTTP/1.1\r\nHost: api.test\r\n\r\n")
    assert _ok(read_until(tls, _ok))
    tls.sendall(held_head)
    held = _held(gw)
    assert up.idle_closed.wait(10), "the upstream kept its idle connection"
    meanwhile()
    time.sleep(0.3)  # the gateway has read the close
    assert _sandgate(gw, "requests", "approve", held).returncode == 0
    tls.sendall(body)
    return read_until(tls, _ok)  # or until the gateway closes


def _requests(records: list[dict[str, Any]], path: str) -> list[tuple[str, str, int | None]]:
    return [(r["decision"], r["reason"], r["status"]) for r in records if r.get("path") == path]


@pytest.fixture(params=["general", "lean"])
def path(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# What follows the redialled exchange on the same tunnel: a request the lean layer does not
# serve (HTTP/1.0), pipelined behind the held one, handed over while the new connection is open
# (the lean layer closes it, the general path made for the tunnel dials its own); or a plain one
# sent after the new connection idled out too, which the lean layer serves over a third
# connection. (after an idle wait, the request, the lean layer's handover reason or None, the
# exchanges it served, the upstream connections on the general path)
THEN = {
    "open": (
        False,
        b"GET /third HTTP/1.0\r\nHost: api.test\r\nConnection: keep-alive\r\n\r\n",
        "not_plain",
        2,
        2,
    ),
    "idle": (True, b"GET /third HTTP/1.1\r\nHost: api.test\r\n\r\n", None, 3, 3),
}


@pytest.mark.parametrize(
    "then",
    list(THEN),
    ids=["then a request it hands over", "then a request after the new connection idled out too"],
)
def test_a_request_held_past_the_upstreams_idle_close_goes_over_a_new_connection(
    start_gateway: GatewayFactory, pki: TestPKI, path: str, then: str
) -> None:
    idle, third, handover, lean_exchanges, general_connections = THEN[then]
    # Sent once the approving command returned, the pipelined request must find the new
    # connection still open: a longer idle timeout, so a slow command exit cannot close it.
    with IdleUpstream(pki, idle=IDLE if idle else 2.0) as up:
        gw = start_gateway({"t1.yaml": _tenant(up.port)}, config={"interception": {"http1_path": path}})
        with tls_tunnel(gw, up.port, timeout=15) as tls:
            if idle:
                answer = _hold_past_the_upstreams_close(gw, up, tls)
                up.idle_closed.clear()
                assert up.idle_closed.wait(10), "the upstream kept its idle connection"
                time.sleep(0.3)  # the gateway has read the close
                tls.sendall(third)
                answer += read_until(tls, _ok)
            else:
                # Pipelined: served as soon as the held one is answered, before the new
                # connection could idle out.
                answer = _hold_past_the_upstreams_close(gw, up, tls, body=third)
                if answer.count(b"\r\n\r\nok") < 2:
                    answer += read_until(tls, _ok)
            assert answer.count(b"HTTP/1.1 200 ") == 2 and _ok(answer), answer
        targets = [(n, head.split(b" ")[1]) for n, head in up.requests]
        assert [t for _, t in targets] == [b"/first", b"/held/x", b"/third"], "each went upstream once"
        assert targets[1][0] != targets[0][0], "the held request went over a new connection"
        assert up.connections == (3 if path == "lean" else general_connections)
        if path == "lean":
            counted = lean_counters(gw)
            assert counted["sandgate_http1_lean_exchanges_total"] == lean_exchanges, counted
            handovers = {k: v for k, v in counted.items() if "handovers" in k and v}
            assert handovers == ({f"sandgate_http1_lean_handovers_total:{handover}": 1} if handover else {})
        records = gw.records_until(lambda rs: len(_requests(rs, "/third")) >= 1)
        assert _requests(records, "/first") == [("allow", "allowed", 200)]
        assert _requests(records, "/held/x") == [
            ("ask", "approval_required", None),
            ("allow", "allowed", 200),
        ]
        assert _requests(records, "/third") == [("allow", "allowed", 200)]
        assert [r["error"] for r in records if r.get("path") == "/held/x"] == [None, None]
        assert "Traceback" not in gw.log()


def test_each_hold_past_an_idle_close_dials_again(
    start_gateway: GatewayFactory, pki: TestPKI, path: str
) -> None:
    second = b"GET /held/y HTTP/1.1\r\nHost: api.test\r\n\r\n"
    with IdleUpstream(pki) as up:
        gw = start_gateway({"t1.yaml": _tenant(up.port)}, config={"interception": {"http1_path": path}})
        with tls_tunnel(gw, up.port, timeout=15) as tls:
            # /held/y pipelined: read (and held) as soon as /held/x is answered.
            answer = _hold_past_the_upstreams_close(gw, up, tls, body=second)
            up.idle_closed.clear()
            held = _held(gw)
            assert up.idle_closed.wait(10), "the upstream kept its idle connection"
            time.sleep(0.3)  # the gateway has read the close
            assert _sandgate(gw, "requests", "approve", held).returncode == 0
            if answer.count(b"\r\n\r\nok") < 2:
                answer += read_until(tls, _ok)
        assert answer.count(b"HTTP/1.1 200 ") == 2 and _ok(answer), answer
        numbers = [n for n, _ in up.requests]
        assert [head.split(b" ")[1] for _, head in up.requests] == [b"/first", b"/held/x", b"/held/y"]
        assert len(set(numbers)) == 3 and up.connections == 3, "a new connection for each"
        if path == "lean":
            counted = lean_counters(gw)
            assert counted["sandgate_http1_lean_exchanges_total"] == 3 and not any(
                v for k, v in counted.items() if "handovers" in k
            ), counted
        records = gw.records_until(lambda rs: len(_requests(rs, "/held/y")) >= 2)
        for held_path in ("/held/x", "/held/y"):
            assert _requests(records, held_path) == [
                ("ask", "approval_required", None),
                ("allow", "allowed", 200),
            ]
        assert "Traceback" not in gw.log()


def test_a_held_request_whose_body_streams_goes_over_a_new_connection_body_and_all(
    start_gateway: GatewayFactory, pki: TestPKI, path: str
) -> None:
    size = 3 << 20  # over stream_large_bodies (1 MiB): streamed once decided
    head = b"POST /held/up HTTP/1.1\r\nHost: api.test\r\nContent-Length: %d\r\n\r\n" % size
    with IdleUpstream(pki) as up:
        gw = start_gateway({"t1.yaml": _tenant(up.port)}, config={"interception": {"http1_path": path}})
        with tls_tunnel(gw, up.port, timeout=15) as tls:
            answer = _hold_past_the_upstreams_close(gw, up, tls, held_head=head, body=b"b" * size)
        assert answer.startswith(b"HTTP/1.1 200 ") and _ok(answer), answer
        assert [head.split(b" ")[1] for _, head in up.requests] == [b"/first", b"/held/up"]
        assert up.bodies == [0, size] and up.requests[1][0] != up.requests[0][0]
        records = gw.records_until(lambda rs: len(_requests(rs, "/held/up")) >= 2)
        assert _requests(records, "/held/up") == [
            ("ask", "approval_required", None),
            ("allow", "allowed", 200),
        ]
        assert "Traceback" not in gw.log()


def _untrusted(directory: Path) -> ssl.SSLContext:
    """A server context whose certificate no CA the gateway trusts signed."""
    directory.mkdir()
    other = TestPKI(["api.test", UPSTREAM_IP], directory=directory, common_name="not the test CA")
    return other.server_context()


@pytest.mark.parametrize(
    "failure", ["refused", "untrusted"], ids=["its port refuses", "its certificate is not trusted"]
)
def test_a_redial_that_fails_is_a_recorded_502_and_nothing_hangs(
    start_gateway: GatewayFactory, pki: TestPKI, path: str, failure: str, tmp_path: Path
) -> None:
    with IdleUpstream(pki) as up:
        gw = start_gateway({"t1.yaml": _tenant(up.port)}, config={"interception": {"http1_path": path}})

        def break_upstream() -> None:
            if failure == "refused":
                up.stop_listening()
            else:
                up.context = _untrusted(tmp_path / "other-ca")

        with tls_tunnel(gw, up.port, timeout=15) as tls:
            started = time.monotonic()
            answer = _hold_past_the_upstreams_close(gw, up, tls, break_upstream)
            assert time.monotonic() - started < 10, "the failed redial was answered at once"
            rest = read_until(tls, lambda d: False)  # the gateway closed the tunnel: nothing more
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 502 "), answer
        assert json.loads(body)["reason"] == "upstream_unreachable", body
        assert rest == b""
        assert [head.split(b" ")[1] for _, head in up.requests] == [b"/first"], "nothing else went upstream"
        records = gw.records_until(lambda rs: len(_requests(rs, "/held/x")) >= 2)
        assert _requests(records, "/held/x") == [
            ("ask", "approval_required", None),
            ("allow", "upstream_unreachable", 502),
        ]
        (failed,) = [r for r in records if r.get("path") == "/held/x" and r["decision"] == "allow"]
        assert failed["error"] == "upstream unreachable", failed
        assert "Traceback" not in gw.log()


def test_a_request_after_the_upstream_closed_an_idle_connection_is_served_on_a_new_one(
    start_gateway: GatewayFactory, pki: TestPKI, path: str
) -> None:
    """The common case (an agent's tunnel idle between two model calls longer than the upstream
    keeps it): the lean layer dials again itself and keeps the tunnel, nothing is handed over."""
    with IdleUpstream(pki) as up:
        gw = start_gateway({"t1.yaml": _tenant(up.port)}, config={"interception": {"http1_path": path}})
        with tls_tunnel(gw, up.port, timeout=15) as tls:
            tls.sendall(b"GET /first HTTP/1.1\r\nHost: api.test\r\n\r\n")
            answer = read_until(tls, _ok)
            assert up.idle_closed.wait(10), "the upstream kept its idle connection"
            time.sleep(0.3)  # the gateway has read the close
            tls.sendall(b"GET /third HTTP/1.1\r\nHost: api.test\r\n\r\n")
            answer += read_until(tls, _ok)
        assert answer.count(b"HTTP/1.1 200 ") == 2 and _ok(answer), answer
        assert [head.split(b" ")[1] for _, head in up.requests] == [b"/first", b"/third"]
        assert up.connections == 2 and len({n for n, _ in up.requests}) == 2
        if path == "lean":
            counted = lean_counters(gw)
            assert counted["sandgate_http1_lean_exchanges_total"] == 2, counted
            assert not any(v for k, v in counted.items() if "handovers" in k), counted
        records = gw.records_until(lambda rs: len(_requests(rs, "/third")) >= 1)
        assert _requests(records, "/first") == _requests(records, "/third") == [("allow", "allowed", 200)]
        assert "Traceback" not in gw.log()
