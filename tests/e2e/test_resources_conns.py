"""Resource exhaustion by connections, against a real gateway: idle floods under a lowered fd
limit, the per-source and per-sandbox caps, bursts from one source, the idle timeout, and
HTTP/2 rapid reset.

Every attack is bounded in count and time and stays on loopback. The connection attacks run
against a gateway of two workers (SO_REUSEPORT spreads the connections, as in production) from
several source addresses (HTTP/2 rapid reset runs with two in tests/run.sh's second stage);
while one runs, another tenant's requests (a new connection each, from another source address
and from the attack's own) must keep succeeding with p99 under 1 s, and each gateway process's
resident memory must stay under a stated bound.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import resource
import select
import selectors
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import httpx
import pytest
from conftest import (
    OTHER_TOKEN,
    OTHER_TOKEN_REF,
    SANDGATE,
    TOKEN,
    UPSTREAM_IP,
    GatewayFactory,
    RunningGateway,
    tenant_yaml,
    write_gateway_files,
)
from prometheus_client.parser import text_string_to_metric_families
from support import RecordingUpstream, TestPKI, wait_for_port

pytestmark = pytest.mark.slow

# Flood sources: any 127/8 address works on Linux loopback; the other tenant uses 127.0.0.1,
# and the attack's own source address too.
FLOOD_SOURCES = [f"127.0.0.{i}" for i in range(10, 16)]
RSS_BOUND_MB = 400
# The attacks run against this many gateway processes (the default on a 2-core host).
WORKERS = 2


# -- a gateway under a chosen fd limit ---------------------------------------------------------


Launcher = Callable[..., RunningGateway]


@pytest.fixture
def launch(tmp_path: Path, pki: TestPKI) -> Iterator[Launcher]:
    """`sandgate run` with RLIMIT_NOFILE set (soft and hard) before exec, so in each of its
    `workers` processes; stopped at teardown."""
    started: list[RunningGateway] = []

    def start(
        tenants: dict[str, str],
        *,
        config: dict[str, Any] | None = None,
        nofile: int = 4096,
        workers: int = WORKERS,
    ) -> RunningGateway:
        root = tmp_path / f"gw{len(started)}"
        cfg = {
            "upstream": {"trusted_ca": str(pki.ca_file)},
            "workers": {"count": workers},
            **(config or {}),
        }
        config_path, port = write_gateway_files(root, tenants, config=cfg)
        log_path = root / "gateway.log"

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [SANDGATE, "run", "--config", str(config_path)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=root,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                preexec_fn=limit,
            )
        gw = RunningGateway(port=port, root=root, proc=proc, log_path=log_path)
        started.append(gw)
        try:
            wait_for_port("127.0.0.1", port, timeout=30 if workers == 1 else 90)
            if workers > 1:
                # Serving once the supervisor wrote the gateway's status (every worker listens).
                _wait_for_file(root / "state" / "gateway.json", timeout=60)
        except TimeoutError:
            gw.stop()
            raise AssertionError(f"gateway did not start:\n{gw.log()}") from None
        return gw

    yield start
    for gw in started:
        gw.stop()


def two_tenants(upstream: RecordingUpstream, *, inspect_port: int | None = None) -> dict[str, str]:
    """t1/sb1 (the attacker) and t2/sb2 (the bystander), both allowed to api.test."""
    rules: list[dict[str, Any]] = [{"id": "api", "hosts": ["api.test"], "ports": [upstream.port]}]
    if inspect_port is not None:
        rules.append({"id": "api-tls", "hosts": ["api.test"], "ports": [inspect_port], "inspect": True})
    return {
        "t1.yaml": tenant_yaml("t1", rules),
        "t2.yaml": tenant_yaml("t2", rules, sandbox="sb2", token_ref=OTHER_TOKEN_REF),
    }


def _wait_for_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout} s")
        time.sleep(0.05)


def worker_pids(gw: RunningGateway) -> list[int]:
    """The processes that serve: the workers (from the gateway's status file), or the one."""
    try:
        pids = json.loads((gw.root / "state" / "gateway.json").read_text()).get("worker_pids")
    except (OSError, ValueError):
        pids = None
    return [int(pid) for pid in pids] if pids else [gw.proc.pid]


def rss_mb(gw: RunningGateway) -> float:
    """The largest resident set of the gateway's serving processes (the bound is per process)."""
    return max(_rss_mb(pid) for pid in worker_pids(gw))


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def cpu_seconds(gw: RunningGateway) -> float:
    """CPU time of all the gateway's serving processes."""
    total = 0.0
    for pid in worker_pids(gw):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def open_fds(gw: RunningGateway) -> int:
    """The most descriptors one serving process holds (RLIMIT_NOFILE is per process)."""
    counts = []
    for pid in worker_pids(gw):
        try:
            counts.append(len(os.listdir(f"/proc/{pid}/fd")))
        except FileNotFoundError:
            counts.append(0)
    return max(counts)


def scrape(gw: RunningGateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The gateway's /metrics over its admin socket, by (sample name, labels)."""
    transport = httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock"))
    with httpx.Client(transport=transport, base_url="http://sandgate") as c:
        text = c.get("/metrics").raise_for_status().text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def log_lines(gw: RunningGateway) -> int:
    return len(gw.log().splitlines())


# -- the other tenant ----------------------------------------------------------------------------


class Bystander(threading.Thread):
    """A sandbox (by default t2's sb2) from `source`: one request at a time, each on a new
    connection, timed; failures counted.

    A plain HTTP/1.1 exchange on a raw socket: the latency measured is the gateway's, not the
    cost of building a client (the machine's two cores are shared with the attack).
    """

    def __init__(
        self,
        gw: RunningGateway,
        url: str,
        *,
        source: str = "127.0.0.1",
        sandbox: str = "sb2",
        token: str = OTHER_TOKEN,
        interval: float = 0.05,
    ) -> None:
        super().__init__(name=f"bystander {sandbox} from {source}", daemon=True)
        self.gw, self.interval, self.source = gw, interval, source
        credentials = base64.b64encode(f"{sandbox}:{token}".encode()).decode()
        host = httpx.URL(url).netloc.decode()
        self.request = (
            f"GET {url} HTTP/1.1\r\nHost: {host}\r\nProxy-Authorization: Basic {credentials}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop_event = threading.Event()

    def once(self) -> str | None:
        """One request; None when it got 200, else what went wrong."""
        try:
            address = ("127.0.0.1", self.gw.port)
            with socket.create_connection(address, timeout=5, source_address=(self.source, 0)) as s:
                s.sendall(self.request)
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
        except OSError as e:
            return f"{type(e).__name__}: {e}"
        status = answer.split(b"\r\n", 1)[0]
        return None if status.startswith(b"HTTP/1.1 200 ") else f"status line {status!r}"

    def run(self) -> None:
        while not self._stop_event.is_set():
            started = time.monotonic()
            failure = self.once()
            self.latencies.append(time.monotonic() - started)
            if failure is not None:
                self.failures.append(failure)
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(15)

    @property
    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    def assert_served(self, minimum: int) -> None:
        who = self.name
        assert not self.failures, (
            f"{who}: {len(self.failures)} of {len(self.latencies)} failed: {self.failures[:5]}"
        )
        assert len(self.latencies) >= minimum, f"{who}: only {len(self.latencies)} requests"
        assert self.p99 < 1.0, f"{who}: p99 {self.p99:.3f}s over {len(self.latencies)} requests"


class Bystanders:
    """Several bystanders started and stopped together."""

    def __init__(self, *members: Bystander) -> None:
        self.members = members

    def __enter__(self) -> Bystanders:
        for member in self.members:
            member.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def assert_served(self, minimum: int) -> None:
        for member in self.members:
            member.assert_served(minimum)

    def report(self) -> str:
        return ", ".join(f"{m.name}: {len(m.latencies)} p99 {m.p99 * 1000:.0f} ms" for m in self.members)


# -- idle connections ------------------------------------------------------------------------------


def connect_many(port: int, source: str, count: int, *, deadline: float = 5.0) -> list[socket.socket]:
    """Up to `count` TCP connections from `source` to the gateway that sent nothing; those the
    kernel could not complete within `deadline` are dropped."""
    sel = selectors.DefaultSelector()
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((source, 0))
        s.connect_ex(("127.0.0.1", port))
        sel.register(s, selectors.EVENT_WRITE)
    connected: list[socket.socket] = []
    end = time.monotonic() + deadline
    while sel.get_map() and time.monotonic() < end:
        for key, _ in sel.select(0.2):
            ready = key.fileobj
            assert isinstance(ready, socket.socket)
            sel.unregister(ready)
            if ready.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                connected.append(ready)
            else:
                ready.close()
    for key in list(sel.get_map().values()):
        sel.unregister(key.fileobj)
        assert isinstance(key.fileobj, socket.socket)
        key.fileobj.close()
    sel.close()
    return connected


def closed_by_peer(sockets: list[socket.socket], *, wait: float) -> list[socket.socket]:
    """The sockets the gateway closed within `wait` seconds (EOF or reset; nothing was sent)."""
    closed: list[socket.socket] = []
    sel = selectors.DefaultSelector()
    for s in sockets:
        sel.register(s, selectors.EVENT_READ)
    end = time.monotonic() + wait
    while sel.get_map() and (timeout := end - time.monotonic()) > 0:
        for key, _ in sel.select(min(timeout, 0.2)):
            ready = key.fileobj
            assert isinstance(ready, socket.socket)
            try:
                data = ready.recv(1)
            except OSError:
                data = b""
            if not data:
                closed.append(ready)
                sel.unregister(ready)
    sel.close()
    return closed


def close_all(sockets: list[socket.socket]) -> None:
    for s in sockets:
        s.close()


class FdSampler(threading.Thread):
    """The gateway's open descriptors, sampled every 20 ms; `peak` is the most seen."""

    def __init__(self, gw: RunningGateway) -> None:
        super().__init__(name="fd-sampler", daemon=True)
        self.gw = gw
        self.peak = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.02):
            self.peak = max(self.peak, open_fds(self.gw))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


def _refusals(gw: RunningGateway, connections: int) -> list[dict[str, Any]]:
    """The connection_limit records, once they count `connections` refused connections."""

    def refused(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r["reason"] == "connection_limit"]

    return refused(gw.records_until(lambda rs: sum(r["connections"] for r in refused(rs)) >= connections))


def _abuse(record: dict[str, Any]) -> bool:
    return bool(record["reason"] == "protocol_abuse" and record["decision"] == "deny")


def test_an_idle_flood_under_a_low_fd_limit_leaves_other_tenants_served(
    launch: Launcher, http_upstream: RecordingUpstream
) -> None:
    gw = launch(two_tenants(http_upstream), nofile=1024, config={"log": {"format": "json", "level": "info"}})
    url = f"{http_upstream.url_for('api.test')}/ok"
    lines_before = log_lines(gw)
    # The other tenant from its own address and from one the flood comes from.
    others = Bystanders(Bystander(gw, url), Bystander(gw, url, source=FLOOD_SOURCES[0]))
    sampler = FdSampler(gw)
    sampler.start()
    flood: list[socket.socket] = []
    try:
        with others:
            time.sleep(0.5)
            # 6 sources x 256 idle connections: 1,536 at about 400 new connections a second,
            # more than the two workers' 2 x 1,024 descriptors leave room for (each worker
            # keeps headroom for upstream connections, the audit and its peers).
            # (The fd limit is the subject here; each connection costs mitmproxy ~0.35 ms of CPU, so
            # a connection-rate flood is for the host's nftables rate limits, see docs/security/limits.md.)
            for source in FLOOD_SOURCES:
                for _ in range(16):
                    flood += connect_many(gw.port, source, 16)
                    time.sleep(0.04)
            time.sleep(4)  # the flood holds what it got; the other tenant keeps connecting
            rss = rss_mb(gw)
        time.sleep(1.5)  # what the gateway closes, it closes within a sweep
        closed = closed_by_peer(flood, wait=0.5)
    finally:
        others.stop()
        sampler.stop()
        close_all(flood)
    print(
        f"idle flood: {len(flood)} connected, {len(closed)} closed, peak {sampler.peak} fds, RSS {rss:.0f} MB; {others.report()}"
    )
    assert closed, "the gateway closed none of 1,536 idle connections under a 1,024 fd limit"
    assert sampler.peak < 1024 - 64, f"{sampler.peak} descriptors open in one process at the peak"
    # Not one of the other tenant's connections was turned away while idle ones held descriptors.
    others.assert_served(minimum=20)
    assert rss < RSS_BOUND_MB, f"RSS {rss:.0f} MB"
    log = gw.log().splitlines()[lines_before:]
    assert not [line for line in log if "Too many open files" in line]
    # One log line per decision (the bystander's); the flood adds a line per audit record at most.
    assert len([line for line in log if "decision_id" not in line]) < 20, log[:20]
    # The connections closed are audited, aggregated per source, limit and second in each
    # worker: not one record per connection. Wait for the record of the last second too.
    refusals = _refusals(gw, len(closed))
    assert refusals, "no audit record of the closed connections"
    assert len(refusals) <= len(FLOOD_SOURCES) * 2 * WORKERS * 10, len(refusals)
    assert sum(r["connections"] for r in refusals) == len(closed)
    assert {r["client"] for r in refusals} <= set(FLOOD_SOURCES)
    # Once the flood is gone, a new connection is served at once.
    started = time.monotonic()
    assert others.members[1].once() is None
    assert time.monotonic() - started < 1.0


def test_a_source_past_its_connection_cap_gives_up_its_oldest_idle_connections(
    launch: Launcher, http_upstream: RecordingUpstream
) -> None:
    gw = launch(two_tenants(http_upstream), config={"connections": {"max_per_source": 20}})
    url = f"{http_upstream.url_for('api.test')}/ok"
    source = FLOOD_SOURCES[0]
    flood: list[socket.socket] = []
    again: list[socket.socket] = []
    with Bystanders(Bystander(gw, url)) as others:
        try:
            # 60 connections that send nothing from one source, against a cap of 20 for the
            # gateway: 10 on each worker, and the kernel gives each worker more than 10 of them.
            # All new, none is idle yet (one may be about to send): the sweep closes the oldest
            # once they have been quiet for a second.
            flood = connect_many(gw.port, source, 60)
            closed = closed_by_peer(flood, wait=3.0)
            assert (len(flood) - len(closed), len(closed)) == (20, 40)
            # Sandboxes behind the same source still get in (each new connection takes the
            # place of an idle one, then counts for its sandbox once identified) ...
            same = Bystanders(Bystander(gw, url, source=source))
            with same:
                time.sleep(1.0)
            same.assert_served(minimum=5)
            # ... and so does every new connection: the source's oldest idle ones make room.
            again = connect_many(gw.port, source, 8)
            assert closed_by_peer(again, wait=3.0) == []
            closed = closed_by_peer(flood + again, wait=0.5)
            assert len(flood) + len(again) - len(closed) == 20
        finally:
            close_all(flood)
            close_all(again)
    others.assert_served(minimum=5)
    refusals = _refusals(gw, len(closed))
    assert {(r["decision"], r["client"], r["phase"]) for r in refusals} == {("deny", source, "connect")}
    assert all(
        r["detail"] == "connections.max_per_source (20), oldest idle connection closed" for r in refusals
    )
    assert sum(r["connections"] for r in refusals) == len(closed)
    metrics = scrape(gw)
    assert metrics[("sandgate_connections_evicted_total", ())] == len(closed)
    assert metrics[("sandgate_connections_refused_total", ())] == 0
    assert 0 < metrics[("sandgate_open_fds", ())] < 400


def test_tls_sent_straight_to_the_proxy_port_is_audited_per_source_as_invalid_request(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway(two_tenants(http_upstream))
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    for source in (FLOOD_SOURCES[0],) * 5 + (FLOOD_SOURCES[1],):
        raw = socket.create_connection(("127.0.0.1", gw.port), timeout=5, source_address=(source, 0))
        with pytest.raises((ssl.SSLError, OSError)):
            tls.wrap_socket(raw, server_hostname="api.test")  # closed: no handshake, no answer
        raw.close()
    records = gw.records_until(lambda rs: sum(r.get("connections", 0) for r in rs) >= 6)
    assert {(r["decision"], r["reason"], r["phase"]) for r in records} == {("deny", "invalid_request", "tls")}
    by_source: Counter[str] = Counter()
    for r in records:
        by_source[r["client"]] += r["connections"]
    assert by_source == {FLOOD_SOURCES[0]: 5, FLOOD_SOURCES[1]: 1}
    # One record per source and second (with workers: per worker too), not one a connection.
    assert len([r for r in records if r["client"] == FLOOD_SOURCES[0]]) <= 2
    assert all("TLS sent to the proxy port" in r["detail"] for r in records)


def test_a_sandbox_past_its_connection_cap_gets_429_once_identified(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    # One worker: the exact count is the subject (with N, each worker holds ceil(3 / N) of it).
    caps = {"connections": {"max_per_sandbox": 3}, "workers": {"count": 1}}
    gw = start_gateway(two_tenants(http_upstream), config=caps)
    url = f"{http_upstream.url_for('api.test')}/ok"

    def kept_alive(sandbox: str, token: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=5)
        auth = base64.b64encode(f"{sandbox}:{token}".encode()).decode()
        conn.request("GET", url, headers={"Proxy-Authorization": f"Basic {auth}"})
        resp = conn.getresponse()
        resp.read()
        return conn, resp

    held = [kept_alive("sb1", TOKEN) for _ in range(3)]
    try:
        assert [r.status for _, r in held] == [200, 200, 200]
        extra, resp = kept_alive("sb1", TOKEN)
        assert resp.status == 429
        assert resp.getheader("X-Sandgate-Reason") == "connection_limit"
        assert resp.getheader("Connection") == "close"
        record = gw.record(resp.getheader("X-Sandgate-Decision-Id") or "")
        assert (record["decision"], record["sandbox"], record["detail"]) == (
            "deny",
            "sb1",
            "connections.max_per_sandbox (3)",
        )
        extra.close()
        # Another tenant's sandbox is not affected; a freed slot is usable again.
        other, resp = kept_alive("sb2", OTHER_TOKEN)
        assert resp.status == 200
        other.close()
        held.pop()[0].close()
        # The slot is freed once the gateway has read the close: until then, 429 (not forwarded).
        deadline = time.monotonic() + 10
        while True:
            again, resp = kept_alive("sb1", TOKEN)
            if resp.status != 429 or time.monotonic() > deadline:
                break
            again.close()
            time.sleep(0.1)
        assert resp.status == 200
        held.append((again, resp))
    finally:
        for conn, _ in held:
            conn.close()
    assert len(http_upstream.requests) == 5


# -- many sandboxes behind one source address ----------------------------------------------------


def test_idle_connections_from_one_source_leave_the_sandboxes_behind_it_served(
    launch: Launcher, http_upstream: RecordingUpstream
) -> None:
    """Containers behind one NAT address, or every sandbox on the host's loopback: one source
    holding far more idle connections than its cap must not lock its other sandboxes out."""
    gw = launch(two_tenants(http_upstream), config={"connections": {"max_per_source": 64}})
    url = f"{http_upstream.url_for('api.test')}/ok"
    shared = FLOOD_SOURCES[1]
    others = Bystanders(
        Bystander(gw, url, source=shared),
        Bystander(gw, url, source=shared, sandbox="sb1", token=TOKEN),
        Bystander(gw, url),
    )
    flood: list[socket.socket] = []
    try:
        with others:
            time.sleep(0.3)
            for _ in range(20):  # 400 idle connections from the shared address, 6 x its cap
                flood += connect_many(gw.port, shared, 20)
                time.sleep(0.05)
            time.sleep(2.0)
        time.sleep(1.5)  # a sweep: what the gateway closes, it has closed
        closed = closed_by_peer(flood, wait=0.5)
    finally:
        others.stop()
        close_all(flood)
    print(f"one source: {len(flood)} connected, {len(closed)} closed; {others.report()}")
    others.assert_served(minimum=20)
    # The source keeps at most its cap of connections that never identified themselves.
    assert len(flood) - len(closed) <= 64, f"{len(flood) - len(closed)} idle connections held"
    refusals = _refusals(gw, len(closed))
    assert {(r["client"], r["detail"]) for r in refusals} == {
        (shared, "connections.max_per_source (64), oldest idle connection closed")
    }
    assert sum(r["connections"] for r in refusals) == len(closed)


def _answer_complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:[ \t]*(\d+)", head)
    return bool(sep and length and len(body) >= int(length.group(1)))


def burst(port: int, source: str, request: bytes, count: int, *, deadline: float = 30.0) -> list[bytes]:
    """`count` connections from `source` opened at once, each sending `request` once connected
    and kept open: what each received, a whole answer (head and Content-Length body) or what
    came before the gateway closed it (b"" for nothing, or when it never connected)."""
    sel = selectors.DefaultSelector()
    received: dict[socket.socket, bytes] = {}
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((source, 0))
        s.connect_ex(("127.0.0.1", port))
        received[s] = b""
        sel.register(s, selectors.EVENT_WRITE)
    end = time.monotonic() + deadline
    try:
        while sel.get_map() and time.monotonic() < end:
            for key, events in sel.select(0.2):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                if events & selectors.EVENT_WRITE:
                    sel.unregister(ready)
                    if ready.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                        ready.sendall(request)  # a few hundred bytes: the socket buffer takes them
                        sel.register(ready, selectors.EVENT_READ)
                    continue
                try:
                    chunk = ready.recv(65536)
                except OSError:
                    chunk = b""
                received[ready] += chunk
                if not chunk or _answer_complete(received[ready]):
                    sel.unregister(ready)
    finally:
        sel.close()
        answers = list(received.values())
        close_all(list(received))
    return answers


def test_a_burst_from_one_source_gets_an_answer_on_every_connection(
    launch: Launcher, http_upstream: RecordingUpstream
) -> None:
    """Hundreds of concurrent requests from one address (a busy build behind a NAT): each
    connection is served or, past its sandbox's cap, answered 429 `connection_limit`; none is
    closed at connect by the per-source cap, which counts only connections not identified yet."""
    gw = launch(
        two_tenants(http_upstream), config={"connections": {"max_per_source": 32, "max_per_sandbox": 64}}
    )
    url = f"{http_upstream.url_for('api.test')}/ok"
    shared = FLOOD_SOURCES[2]
    # 200 at once: a busy build (3 x its sandbox's cap here, 6 x its source's), small enough
    # for two workers sharing two cores with the test (and CI's other tests) to answer the
    # other tenant within a second meanwhile.
    count = 200
    credentials = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    request = (
        f"GET {url} HTTP/1.1\r\nHost: api.test\r\nProxy-Authorization: Basic {credentials}\r\n\r\n"
    ).encode()
    with Bystanders(Bystander(gw, url, source=shared), Bystander(gw, url)) as others:
        time.sleep(0.3)
        answers = burst(gw.port, shared, request, count)
        time.sleep(0.5)
    status_lines = [a.split(b"\r\n", 1)[0] for a in answers]
    print(f"burst: {sorted(Counter(status_lines).items())}; {others.report()}")
    others.assert_served(minimum=10)
    unanswered = [a for a in answers if not a.startswith(b"HTTP/1.1 ")]
    assert not unanswered, f"{len(unanswered)} of {count} connections closed without an answer"
    served = [a for a in answers if a.startswith(b"HTTP/1.1 200 ")]
    limited = [a for a in answers if a.startswith(b"HTTP/1.1 429 ")]
    assert len(served) + len(limited) == count, sorted(set(status_lines))
    assert all(b"\r\nX-Sandgate-Reason: connection_limit\r\n" in a for a in limited)
    # The cap is the gateway's: 32 on each of the two workers, and each got far more than 32.
    assert len(served) == 64
    records = gw.records_until(lambda rs: sum(r["reason"] == "connection_limit" for r in rs) >= len(limited))
    refused = [r for r in records if r["reason"] == "connection_limit"]
    assert {(r["sandbox"], r["phase"], r["client"].rpartition(":")[0]) for r in refused} == {
        ("sb1", "request", shared)
    }
    assert {r["detail"] for r in refused} == {"connections.max_per_sandbox (64)"}


# -- the idle timeout --------------------------------------------------------------------------------


def test_a_silent_connection_is_closed_after_the_idle_timeout(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    gw = start_gateway(two_tenants(http_upstream), config={"connections": {"idle_timeout_seconds": 1}})
    started = time.monotonic()
    (silent,) = connect_many(gw.port, "127.0.0.1", 1)
    # Keep-alive after a request, with nothing in flight: idle too.
    kept = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=5)
    auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    kept.request(
        "GET", f"{http_upstream.url_for('api.test')}/ok", headers={"Proxy-Authorization": f"Basic {auth}"}
    )
    assert kept.getresponse().read()
    assert kept.sock is not None
    try:
        closed = closed_by_peer([silent, kept.sock], wait=6)
        elapsed = time.monotonic() - started
    finally:
        silent.close()
        kept.close()
    assert len(closed) == 2, "an idle connection was still open after 6 s (idle timeout 1 s)"
    assert 0.9 < elapsed < 6
    assert scrape(gw)[("sandgate_connections_idle_closed_total", ())] == 2


def test_the_idle_timeout_spares_a_request_in_flight_and_a_passthrough_tunnel(
    start_gateway: GatewayFactory, pki: TestPKI, https_upstream: RecordingUpstream
) -> None:
    with RecordingUpstream(UPSTREAM_IP, name="slow", delay=2.5) as slow:
        rules = [
            {"id": "slow", "hosts": ["api.test"], "ports": [slow.port]},
            {"id": "pass", "hosts": ["pass.test"], "ports": [https_upstream.port]},
        ]
        gw = start_gateway(
            {"t1.yaml": tenant_yaml("t1", rules)}, config={"connections": {"idle_timeout_seconds": 1}}
        )
        with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
            assert c.get(f"{slow.url_for('api.test')}/slow").status_code == 200
        # A passthrough tunnel is left to the tunnel timeout: quiet for 2.5 s, then used.
        ctx = ssl.create_default_context(cafile=str(pki.ca_file))
        with httpx.Client(proxy=gw.proxy(), verify=ctx, timeout=10) as c:
            url = f"{https_upstream.url_for('pass.test')}/first"
            assert c.get(url).status_code == 200
            time.sleep(2.5)
            assert c.get(f"{https_upstream.url_for('pass.test')}/second").status_code == 200
        assert len({r.connection_id for r in https_upstream.requests}) == 1


# -- HTTP/2 rapid reset ----------------------------------------------------------------------------


def h2_tunnel(gw: RunningGateway, host: str, port: int) -> ssl.SSLSocket:
    """An intercepted TLS tunnel through the explicit proxy that negotiated HTTP/2 (sandbox sb1)."""
    raw = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    credentials = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    raw.sendall(
        f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\nProxy-Authorization: Basic {credentials}\r\n\r\n".encode()
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = raw.recv(4096)
        assert chunk, f"proxy closed: {answer!r}"
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer
    tls = ssl.create_default_context(cafile=str(gw.ca_file))
    tls.set_alpn_protocols(["h2"])
    conn = tls.wrap_socket(raw, server_hostname=host)
    assert conn.selected_alpn_protocol() == "h2"
    return conn


def rapid_reset(
    conn: ssl.SSLSocket, host: str, *, pairs: int, seconds: float
) -> tuple[int, list[h2.events.Event]]:
    """Send HEADERS+RST_STREAM pairs (at most `pairs`, for at most `seconds`) until the gateway
    ends the connection; returns (pairs sent, what the gateway sent back)."""
    h2c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    h2c.initiate_connection()
    conn.sendall(h2c.data_to_send())
    headers = [(":method", "GET"), (":scheme", "https"), (":authority", host), (":path", "/reset")]
    received: list[h2.events.Event] = []
    sent = 0
    end = time.monotonic() + seconds
    conn.setblocking(False)
    try:
        while sent < pairs and time.monotonic() < end:
            for _ in range(min(100, pairs - sent)):
                stream_id = h2c.get_next_available_stream_id()
                h2c.send_headers(stream_id, headers, end_stream=True)
                h2c.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                sent += 1
            data = h2c.data_to_send()
            while data:
                try:
                    n = conn.send(data)
                    data = data[n:]
                except (ssl.SSLWantWriteError, BlockingIOError):
                    select.select([], [conn], [], 0.05)
                    if time.monotonic() > end:
                        return sent, received
            try:
                while chunk := conn.recv(65536):
                    received += h2c.receive_data(chunk)
                    if any(isinstance(e, h2.events.ConnectionTerminated) for e in received):
                        return sent, received
                return sent, received  # closed by the gateway
            except (ssl.SSLWantReadError, BlockingIOError):
                pass
    except (ConnectionError, ssl.SSLError, h2.exceptions.ProtocolError):
        return sent, received
    return sent, received


def test_http2_rapid_reset_gets_goaway_and_other_tenants_stay_served(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, https_upstream: RecordingUpstream
) -> None:
    gw = start_gateway(two_tenants(http_upstream, inspect_port=https_upstream.port))
    bystander = Bystander(gw, f"{http_upstream.url_for('api.test')}/ok")
    conn = h2_tunnel(gw, "api.test", https_upstream.port)
    bystander.start()
    try:
        time.sleep(0.3)
        sent, received = rapid_reset(conn, "api.test", pairs=20_000, seconds=5)
        rss = rss_mb(gw)
        # The gateway settles: within 2 s after the attack, it serves normally again.
        time.sleep(0.5)
        cpu_before = cpu_seconds(gw)
        time.sleep(1.5)
        cpu_settled = (cpu_seconds(gw) - cpu_before) / 1.5
    finally:
        bystander.stop()
        conn.close()
    goaway = [e for e in received if isinstance(e, h2.events.ConnectionTerminated)]
    assert goaway, f"no GOAWAY after {sent} HEADERS+RST_STREAM pairs"
    assert goaway[0].error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert sent < 20_000
    bystander.assert_served(minimum=10)
    assert rss < RSS_BOUND_MB, f"RSS {rss:.0f} MB"
    assert cpu_settled < 0.5, f"gateway still at {cpu_settled:.0%} CPU 0.5-2 s after the attack"
    started = time.monotonic()
    assert bystander.once() is None
    assert time.monotonic() - started < 1.0
    # One record for the abusive connection, which stands for the streams in progress that the
    # GOAWAY cut too (it names their decisions); the streams it reset before stay few.
    records = gw.records_until(lambda rs: any(_abuse(r) for r in rs))
    abuse = [r for r in records if _abuse(r)]
    assert len(abuse) == 1
    assert abuse[0]["detail"] and "streams reset or refused" in abuse[0]["detail"]
    settled = gw.settled()
    assert [r for r in settled if r["reason"] == "protocol_abuse"] == abuse, "one record, not one a stream"
    cut = set(abuse[0]["streams_cut"])
    assert not cut & {r["decision_id"] for r in settled if r is not abuse[0]}, (
        "a cut stream has no own record"
    )
    assert scrape(gw)[("sandgate_http2_abusive_connections_total", ())] == 1
    assert (abuse[0]["decision"], abuse[0]["sandbox"], abuse[0]["dest"]["host"]) == (
        "deny",
        "sb1",
        "api.test",
    )
    assert len([r for r in settled if r["sandbox"] == "sb1"]) < 600
