"""Nothing lost when a worker dies inside an intercepted exchange: HTTPS through the gateway's
TLS interception (the lean HTTP/1.1 layer, the default, and mitmproxy's general path), a real
`sandgate run` with two workers, a slow TLS upstream on loopback, one worker SIGKILLed while
requests sit at the upstream or while one is held for an operator; counted from the upstream's
side, the client's side and the trail's.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import ssl
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest
import yaml
from conftest import OTHER_TOKEN, OTHER_TOKEN_REF, TOKEN, TOKEN_REF, GatewayFactory, RunningGateway, curl
from prometheus_client.parser import text_string_to_metric_families
from support import RecordingUpstream, TestPKI
from support.processes import alive, gateway_status, wait_until

from .test_process_death import assert_each_request_recorded_once, trail

pytestmark = pytest.mark.slow

UPSTREAM_IP = "127.0.0.2"
PATHS = ("lean", "general")
# Each test runs on both paths of intercepted HTTP/1.1 (the environment chooses one).
ON_EACH_PATH = pytest.mark.parametrize("path", PATHS, ids=[f"on the {p} path" for p in PATHS])
SENT = 16


def two_workers(path: str) -> dict[str, str]:
    """The environment of a gateway with two workers whose intercepted HTTP/1.1 takes `path`."""
    return {"SANDGATE_WORKERS": "2", "SANDGATE_HTTP1_PATH": path}


def tenant(name: str, sandbox: str, token_ref: str, port: int, *, ask: str | None = None) -> str:
    """A tenant whose sandbox reaches api.test:`port` intercepted. With `ask="request"`, only its
    GETs are allowed and anything else is held for an operator; with `ask="tool call"`, its
    requests are allowed and an MCP call of a `merge_*` tool in a body is held."""
    allow: dict[str, Any] = {"id": "api", "hosts": ["api.test"], "ports": [port], "inspect": True}
    doc: dict[str, Any] = {"tenant": name, "sandboxes": [{"id": sandbox, "token": token_ref}]}
    if ask == "request":
        allow["methods"] = ["GET"]
        doc["ask"] = [{"id": "writes", "hosts": ["api.test"], "ports": [port]}]
    elif ask == "tool call":
        allow["mcp"] = {"tools": {"ask": ["merge_*"]}}
    return yaml.safe_dump({**doc, "allow": [allow]}, sort_keys=False)


# What is held: a request an `ask` rule matched (its record's place is reserved once it is
# released), or an MCP call in the body of a request already allowed (its place reserved).
HELD = {
    "request": b'{"x": 1}',
    "tool call": json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "merge_pull", "arguments": {}}}
    ).encode(),
}


def admin(gw: RunningGateway) -> httpx.Client:
    """The gateway's admin API (the lead's socket: the gateway's sums and listings)."""
    transport = httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock"))
    return httpx.Client(transport=transport, base_url="http://sandgate", timeout=10)


def metric(gw: RunningGateway, name: str) -> float:
    """The gateway's value of the metric sample `name` (summed over its label sets)."""
    with admin(gw) as c:
        text = c.get("/metrics").raise_for_status().text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def assert_no_journal_left(gw: RunningGateway) -> None:
    assert not list((gw.root / "state" / "workers").glob("w*/intents-*.log")), "settled journals stay"


class Clients:
    """`count` HTTPS GETs through the gateway's interception (each its own tunnel, path /r<i>),
    sent at once by curl; their status codes."""

    def __init__(self, gw: RunningGateway, url: str, count: int) -> None:
        self.codes: dict[int, str] = {}
        args = ("--http1.1", "--cacert", str(gw.ca_file), "-x", gw.proxy())
        self._threads = [
            threading.Thread(target=self._one, args=(args, f"{url}/r{i}", i)) for i in range(count)
        ]
        for t in self._threads:
            t.start()

    def _one(self, args: tuple[str, ...], url: str, i: int) -> None:
        done = curl("-o", "/dev/null", "-w", "%{http_code}", "-m", "30", *args, url)
        self.codes[i] = done.stdout

    def join(self) -> dict[int, str]:
        for t in self._threads:
            t.join(60)
        return self.codes


@ON_EACH_PATH
def test_a_worker_killed_with_intercepted_requests_upstream_leaves_none_unrecorded(
    start_gateway: GatewayFactory, pki: TestPKI, path: str
) -> None:
    with RecordingUpstream(UPSTREAM_IP, tls=pki, delay=2.0, name="slow-tls") as upstream:
        gw = start_gateway({"t1.yaml": tenant("t1", "sb1", TOKEN_REF, upstream.port)}, env=two_workers(path))
        status = wait_until(lambda: gateway_status(gw), "both workers to serve")
        victim = status["worker_pids"][1]
        clients = Clients(gw, f"https://api.test:{upstream.port}", SENT)
        upstream.wait_for_requests(SENT, timeout=20)
        os.kill(victim, signal.SIGKILL)
        codes = clients.join()
        wait_until(lambda: not alive(victim), "the worker to die")
        # The supervisor writes the dead worker's open intents before it restarts it.
        gw.records_until(lambda rs: sum(r["phase"] == "request" for r in rs) >= SENT)
        counted = wait_until(
            lambda: metric(gw, "sandgate_audit_cut_by_exit_total") or None, "the cut records counted"
        )
        lean_exchanges = metric(gw, "sandgate_http1_lean_exchanges_total")
        assert gw.stop() == 0
    records = trail(gw.root)
    assert_each_request_recorded_once(upstream, records)
    assert sorted(r.target for r in upstream.requests) == sorted(f"/r{i}" for i in range(SENT))
    cut = [r for r in records if r.get("error") == "cut by worker exit"]
    answered = [i for i, code in codes.items() if code == "200"]
    assert cut and len(cut) + len(answered) == SENT, (len(cut), codes)
    assert {(r["phase"], r["decision"], r["worker"], r["status"]) for r in cut} == {
        ("request", "allow", 1, None)
    }
    served = [r for r in records if r["phase"] == "request" and not r.get("error")]
    assert {(r["worker"], r["status"]) for r in served} <= {(0, 200)}
    assert sorted(r["path"] for r in served) == sorted(f"/r{i}" for i in answered)
    # The cut requests' tunnels keep their records too (connect and TLS, each once), whether the
    # dead worker had handed them over or the supervisor wrote them from its journal.
    for phase in ("connect", "tls"):
        tunnels = Counter(r["client"] for r in records if r["phase"] == phase)
        assert all(tunnels[r["client"]] == 1 for r in cut), phase
    # The counter counts the cut requests only; the tunnels' records written from the journal
    # with them (complete as they were) are in the log's `records`, not in the counter.
    settled = [json.loads(line) for line in gw.log().splitlines() if '"audit.cut_by_exit"' in line]
    assert counted == sum(e["cut"] for e in settled) == len(cut)
    assert sum(e["records"] for e in settled) >= len(cut)
    # The surviving worker's answers came through the layer the test asked for.
    assert (lean_exchanges >= len(answered)) if path == "lean" else lean_exchanges == 0
    assert_no_journal_left(gw)


class Tunnel:
    """An intercepted HTTPS tunnel to api.test through the gateway, kept alive between requests."""

    def __init__(self, gw: RunningGateway, port: int, sandbox: str, token: str) -> None:
        auth = base64.b64encode(f"{sandbox}:{token}".encode()).decode()
        raw = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
        target = f"api.test:{port}"
        raw.sendall(
            f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = raw.recv(1)
            assert chunk, head
            head += chunk
        assert head.startswith(b"HTTP/1.1 200"), head
        context = ssl.create_default_context(cafile=str(gw.ca_file))
        context.set_alpn_protocols(["http/1.1"])
        self.tls = context.wrap_socket(raw, server_hostname="api.test")
        self._buffered = b""

    def send(self, method: str, path: str, body: bytes = b"") -> None:
        head = f"{method} {path} HTTP/1.1\r\nHost: api.test\r\nContent-Length: {len(body)}\r\n\r\n"
        self.tls.sendall(head.encode() + body)

    def answer(self) -> int:
        """The status of the next response (its body read and dropped)."""
        data = self._buffered
        while b"\r\n\r\n" not in data:
            data += self._recv()
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(fields.get("content-length", "0"))
        while len(rest) < length:
            rest += self._recv()
        self._buffered = rest[length:]
        return int(lines[0].split()[1])

    def get(self, path: str) -> int:
        self.send("GET", path)
        return self.answer()

    def closed(self) -> bool:
        """True once the gateway's side of the tunnel is gone (nothing more comes)."""
        try:
            return self.tls.recv(65536) == b""
        except (ConnectionError, ssl.SSLError):
            return True

    def close(self) -> None:
        self.tls.close()

    def _recv(self) -> bytes:
        chunk = self.tls.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the response was whole")
        return chunk


def records_of(gw: RunningGateway, path: str) -> list[dict[str, Any]]:
    """The decision records of requests for `path`, once there is one."""
    records = gw.records_until(lambda rs: any(r.get("path") == path for r in rs))
    return [r for r in records if r.get("path") == path]


def tunnel_on_worker(
    gw: RunningGateway, port: int, sandbox: str, token: str, worker: int, tag: str
) -> Tunnel:
    """A tunnel of `sandbox` that the kernel gave to `worker` (known from the record of a GET on
    it); the others are closed. Each new connection lands on either worker, so 16 tries all miss
    with a probability of 1 in 65,536."""
    for attempt in range(16):
        t = Tunnel(gw, port, sandbox, token)
        probe = f"/{tag}-probe{attempt}"
        assert t.get(probe) == 200
        [record] = records_of(gw, probe)
        if record["worker"] == worker:
            return t
        t.close()
    raise AssertionError(f"no tunnel of {sandbox} landed on worker {worker}")


class Steady:
    """GETs on one kept-alive tunnel, one after another, until stopped; their statuses and when
    each was answered."""

    def __init__(self, tunnel: Tunnel) -> None:
        self.answers: list[tuple[float, int | str]] = []
        self._tunnel = tunnel
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                status: int | str = self._tunnel.get(f"/steady{n}")
            except (OSError, ssl.SSLError) as e:
                status = repr(e)
            self.answers.append((time.monotonic(), status))
            if not isinstance(status, int):
                return
            n += 1
            time.sleep(0.05)

    def stop(self) -> list[tuple[float, int | str]]:
        self._stop.set()
        self._thread.join(30)
        return self.answers


def replaced(gw: RunningGateway, victim: int) -> bool:
    """True once every worker serves again, worker 1 with a new process."""
    status = gateway_status(gw)
    return status is not None and status["worker_pids"][1] != victim


@ON_EACH_PATH
@pytest.mark.parametrize("what", list(HELD))
def test_a_worker_killed_while_an_intercepted_request_is_held_sends_nothing_and_records_it(
    start_gateway: GatewayFactory, pki: TestPKI, path: str, what: str
) -> None:
    with RecordingUpstream(UPSTREAM_IP, tls=pki, name="held-tls") as upstream:
        port = upstream.port
        gw = start_gateway(
            {
                "t1.yaml": tenant("t1", "sb1", TOKEN_REF, port, ask=what),
                "t2.yaml": tenant("t2", "sb2", OTHER_TOKEN_REF, port),
            },
            env=two_workers(path),
        )
        status = wait_until(lambda: gateway_status(gw), "both workers to serve")
        victim = status["worker_pids"][1]
        asking = tunnel_on_worker(gw, port, "sb1", TOKEN, 1, "t1")
        other = tunnel_on_worker(gw, port, "sb2", OTHER_TOKEN, 0, "t2")
        assert asking.get("/before") == 200, "the tunnel is kept alive, its GETs allowed"
        asking.send("POST", "/hold", HELD[what])
        with admin(gw) as lead:
            [pending] = wait_until(
                lambda: [
                    r for r in lead.get("/v1/access-requests").json()["requests"] if r["state"] == "held"
                ],
                "the POST to be held",
                15,
            )
        assert (pending["worker"], pending["tenant"], pending["method"], pending["path"]) == (
            1,
            "t1",
            "POST",
            "/hold",
        )
        steady = Steady(other)
        wait_until(lambda: steady.answers or None, "a steady answer before the kill", 15)
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: not alive(victim), "the worker to die")
        assert asking.closed(), "the held request's tunnel ends with its worker, unanswered"
        wait_until(lambda: replaced(gw, victim), "worker 1 to serve again")
        # The operator approves it after the death: nothing is left to release.
        with admin(gw) as lead:
            late = lead.post(f"/v1/access-requests/{pending['id']}/approve", json={"by": "test"})
            listed = lead.get("/v1/access-requests").json()["requests"]
        time.sleep(1.0)  # anything released would reach the upstream by now
        answers = steady.stop()
        lean_exchanges = metric(gw, "sandgate_http1_lean_exchanges_total")
        other.close()
        asking.close()
        assert gw.stop() == 0
    records = trail(gw.root)
    assert "/hold" not in [r.target for r in upstream.requests], "the held request never went upstream"
    assert late.status_code == 404, late.text
    assert [r for r in listed if r["id"] == pending["id"] and r["state"] == "held"] == []
    held = [r for r in records if r.get("path") == "/hold"]
    # Recorded as asked about by the worker that held it, then its end as the supervisor wrote
    # it from that worker's journal: refused, cut by the exit, never answered.
    assert [(r["decision"], r["reason"], r["worker"]) for r in held] == [
        ("ask", "approval_required", 1),
        ("deny", "internal_error", 1),
    ]
    assert held[0]["approval_id"] == held[1]["approval"]["id"] == pending["id"]
    assert (held[1]["error"], held[1]["status"]) == ("cut by worker exit", None)
    # The other tenant's tunnel, on the other worker, was served before, during and after the death.
    assert [s for _, s in answers] == [200] * len(answers), answers
    assert [t for t, _ in answers if t < killed_at] and [t for t, _ in answers if t > killed_at + 1.0]
    steady_records = [r for r in records if (r.get("path") or "").startswith("/steady")]
    assert len(steady_records) == len(answers)
    assert {(r["tenant"], r["worker"], r["status"]) for r in steady_records} == {("t2", 0, 200)}
    assert (lean_exchanges >= len(answers)) if path == "lean" else lean_exchanges == 0
    assert_each_request_recorded_once(upstream, records)
    assert_no_journal_left(gw)
