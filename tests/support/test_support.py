"""Smoke tests of the loopback test servers, with real clients (httpx, ssl, dnspython)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import dns.message
import dns.query
import dns.rcode
import httpx
import pytest

from . import ports
from .dnsserver import Answers, ScriptedDNSServer
from .nginx import NginxServer
from .pki import TestPKI
from .ports import free_port, wait_for_port
from .upstream import RecordingUpstream


@pytest.fixture
def pki(tmp_path: Path) -> TestPKI:
    return TestPKI(directory=tmp_path)


@pytest.fixture
def upstream() -> Iterator[RecordingUpstream]:
    with RecordingUpstream(name="plain") as up:
        yield up


@pytest.fixture
def tls_upstream(pki: TestPKI) -> Iterator[RecordingUpstream]:
    with RecordingUpstream(tls=pki, name="tls") as up:
        yield up


def _client(*, verify: ssl.SSLContext | bool = True, headers: dict[str, str] | None = None) -> httpx.Client:
    """An httpx client that ignores proxy settings from the environment."""
    return httpx.Client(trust_env=False, timeout=5, verify=verify, headers=headers)


def _raw_tls_get(port: int, ctx: ssl.SSLContext, sni: str, path: str = "/") -> bytes:
    """One GET over TLS to 127.0.0.1:port with the given SNI; the whole response."""
    request = f"GET {path} HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n".encode()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=sni) as tls,
    ):
        tls.sendall(request)
        chunks = []
        while chunk := tls.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# --- ports ------------------------------------------------------------------------------


def test_free_port_can_be_bound_and_waited_for() -> None:
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        wait_for_port("127.0.0.1", port, timeout=2)


def test_free_ports_of_two_test_workers_never_meet_and_are_not_handed_out_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No bind: the other band's ports may be handed out to a server of the other test worker.
    monkeypatch.setattr(ports, "_bindable", lambda host, ports: True)
    drawn: dict[str, set[int]] = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
        drawn[worker] = {free_port() for _ in range(50)}
    assert len(drawn["gw0"]) == len(drawn["gw1"]) == 50  # none handed out twice
    assert max(drawn["gw0"]) < min(drawn["gw1"]) and max(drawn["gw1"]) < 32768


def test_a_host_that_cannot_be_bound_is_an_error_not_a_search() -> None:
    with pytest.raises(OSError, match="assign requested address") as raised:
        free_port("192.0.2.1")  # TEST-NET-1: not an address of this host
    assert raised.value.errno == errno.EADDRNOTAVAIL


def test_wait_for_port_times_out_when_nothing_listens() -> None:
    with pytest.raises(TimeoutError, match="nothing listens"):
        wait_for_port("127.0.0.1", free_port(), timeout=0.2)


# --- pki --------------------------------------------------------------------------------


def test_pki_writes_its_files_with_a_private_key(pki: TestPKI) -> None:
    assert pki.ca_file.read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert "PRIVATE KEY" not in pki.cert_file.read_text()
    assert pki.key_file.stat().st_mode & 0o077 == 0


def test_pki_without_a_directory_cleans_up_after_itself() -> None:
    with TestPKI(["only.test"]) as pki:
        directory = pki.directory
        assert pki.cert_file.exists()
    assert not directory.exists()


# --- upstream, plain HTTP ---------------------------------------------------------------


def test_a_fresh_upstream_has_seen_no_connection(upstream: RecordingUpstream) -> None:
    assert upstream.connections == []
    assert upstream.requests == []


def test_upstream_echoes_and_records_requests_on_one_keep_alive_connection(
    upstream: RecordingUpstream,
) -> None:
    with _client() as client:
        r1 = client.get(f"{upstream.url}/a?x=1", headers={"X-Trace": "one"})
        r2 = client.post(f"{upstream.url}/b", content=b"hello")
        r3 = client.post(f"{upstream.url}/c", content=iter([b"chunk", b"ed"]))  # chunked
    assert [r.status_code for r in (r1, r2, r3)] == [200, 200, 200]
    echo = r1.json()
    assert echo["method"] == "GET"
    assert echo["path"] == "/a?x=1"
    assert echo["host"] == f"127.0.0.1:{upstream.port}"
    assert ["X-Trace", "one"] in echo["headers"]
    assert echo["server"] == "plain"
    assert r2.json()["body_len"] == 5
    requests = upstream.requests
    assert [(r.method, r.target, r.body) for r in requests] == [
        ("GET", "/a?x=1", b""),
        ("POST", "/b", b"hello"),
        ("POST", "/c", b"chunked"),
    ]
    assert requests[0].header("x-trace") == "one"
    assert requests[2].header("Transfer-Encoding") == "chunked"
    assert len(upstream.connections) == 1
    assert {r.connection_id for r in requests} == {upstream.connections[0].id}


def test_upstream_serves_a_fixed_response_and_resets() -> None:
    with (
        RecordingUpstream(status=503, body=b"down", content_type="text/plain") as up,
        _client() as client,
    ):
        r = client.get(up.url)
        assert (r.status_code, r.text, r.headers["content-type"]) == (503, "down", "text/plain")
        up.reset()
        assert up.requests == []
        assert up.connections == []
        up.body, up.status = b"changed by a test", 200
        up.reset()
        r = client.get(up.url)
        assert (r.status_code, r.text) == (503, "down"), "reset answers as first configured"


def test_upstream_honours_connection_close(upstream: RecordingUpstream) -> None:
    with _client(headers={"Connection": "close"}) as client:
        client.get(upstream.url)
        client.get(upstream.url)
    assert len(upstream.connections) == 2


def test_upstream_answers_garbage_with_400(upstream: RecordingUpstream) -> None:
    with socket.create_connection(("127.0.0.1", upstream.port), timeout=5) as s:
        s.sendall(b"NOT HTTP\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400 ")
    assert upstream.requests == []
    assert len(upstream.wait_for_connections(1)) == 1


async def test_upstream_serves_200_concurrent_keep_alive_clients(
    upstream: RecordingUpstream,
) -> None:
    async def client(i: int) -> list[int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", upstream.port)
        try:
            statuses = []
            for j in range(2):
                writer.write(f"GET /{i}/{j} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                json.loads(await reader.readexactly(length))
                statuses.append(int(head.split(b" ")[1]))
            return statuses
        finally:
            writer.close()
            await writer.wait_closed()

    results = await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(200))), 20)
    assert all(r == [200, 200] for r in results)
    assert len(upstream.requests) == 400
    assert len(upstream.connections) == 200


# --- upstream, TLS ----------------------------------------------------------------------


def test_tls_upstream_verifies_with_the_test_ca_and_records_sni(
    pki: TestPKI, tls_upstream: RecordingUpstream
) -> None:
    with _client(verify=pki.client_context()) as client:
        r = client.get(f"{tls_upstream.url}/secure")
    assert r.status_code == 200
    assert r.json()["server"] == "tls"
    response = _raw_tls_get(tls_upstream.port, pki.client_context(), "x.api.test", "/raw")
    assert response.startswith(b"HTTP/1.1 200 OK\r\n")
    first, second = tls_upstream.connections
    assert first.tls
    assert first.handshake_ok
    assert first.sni is None, "no SNI is sent for an IP address"
    assert second.sni == "x.api.test"
    assert [r.target for r in tls_upstream.requests] == ["/secure", "/raw"]


def test_tls_upstream_records_a_connection_whose_handshake_failed(
    tls_upstream: RecordingUpstream,
) -> None:
    with TestPKI(["api.test"]) as stranger, pytest.raises(ssl.SSLCertVerificationError):
        _raw_tls_get(tls_upstream.port, stranger.client_context(), "api.test")
    (conn,) = tls_upstream.wait_for_connections(1)
    assert not conn.handshake_ok
    assert tls_upstream.requests == []


# --- DNS --------------------------------------------------------------------------------


@pytest.fixture
def dns_server() -> Iterator[ScriptedDNSServer]:
    records: dict[str, Answers] = {
        "api.test": ["127.0.0.1", "::1"],
        "rebind.test.": [["127.0.0.2"], ["169.254.169.254"]],
        "empty.test": [],
    }
    with ScriptedDNSServer(records=records, ttl=7) as server:
        yield server


def _ask(server: ScriptedDNSServer, name: str, rdtype: str, *, tcp: bool = False) -> dns.message.Message:
    query = dns.message.make_query(name, rdtype)
    if tcp:
        return dns.query.tcp(query, "127.0.0.1", port=server.port, timeout=2)
    return dns.query.udp(query, "127.0.0.1", port=server.port, timeout=2)


def _addresses(response: dns.message.Message) -> list[str]:
    return [rd.to_text() for rrset in response.answer for rd in rrset]


@pytest.mark.parametrize("tcp", [False, True], ids=["over UDP", "over TCP"])
def test_dns_answers_a_and_aaaa_from_the_script(dns_server: ScriptedDNSServer, tcp: bool) -> None:
    a = _ask(dns_server, "api.test", "A", tcp=tcp)
    aaaa = _ask(dns_server, "API.test.", "AAAA", tcp=tcp)
    assert _addresses(a) == ["127.0.0.1"]
    assert _addresses(aaaa) == ["::1"]
    assert a.answer[0].ttl == 7
    assert dns_server.count("api.test") == 2
    assert {q.transport for q in dns_server.queries} == {"tcp" if tcp else "udp"}


def test_dns_rotates_answers_to_simulate_rebinding(dns_server: ScriptedDNSServer) -> None:
    answers = [_addresses(_ask(dns_server, "rebind.test", "A")) for _ in range(3)]
    assert answers == [["127.0.0.2"], ["169.254.169.254"], ["169.254.169.254"]]
    dns_server.reset()
    assert _addresses(_ask(dns_server, "rebind.test", "A")) == ["127.0.0.2"]
    assert dns_server.count("rebind.test", "A") == 1


def test_dns_says_nxdomain_for_unknown_names_and_nodata_for_other_types(
    dns_server: ScriptedDNSServer,
) -> None:
    assert _ask(dns_server, "unknown.test", "A").rcode() == dns.rcode.NXDOMAIN
    empty = _ask(dns_server, "empty.test", "A")
    assert (empty.rcode(), empty.answer) == (dns.rcode.NOERROR, [])
    mx = _ask(dns_server, "api.test", "MX")
    assert (mx.rcode(), mx.answer) == (dns.rcode.NOERROR, [])
    assert [(q.name, q.rdtype, q.rcode) for q in dns_server.queries] == [
        ("unknown.test", "A", "NXDOMAIN"),
        ("empty.test", "A", "NOERROR"),
        ("api.test", "MX", "NOERROR"),
    ]


def test_dns_records_can_change_while_serving(dns_server: ScriptedDNSServer) -> None:
    dns_server.set_records("late.test", ["10.0.0.9"])
    assert _addresses(_ask(dns_server, "late.test", "A")) == ["10.0.0.9"]
    dns_server.remove("late.test")
    assert _ask(dns_server, "late.test", "A").rcode() == dns.rcode.NXDOMAIN


def test_dns_stops_with_an_idle_tcp_client_connected() -> None:
    server = ScriptedDNSServer(records={"a.test": ["127.0.0.1"]}).start()
    wire = dns.message.make_query("a.test", "A").to_wire()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as idle:
        idle.sendall(len(wire).to_bytes(2) + wire)
        assert idle.recv(2)  # the handler is running; now the connection sits idle
        idle.recv(65535)
        server.stop()
        assert idle.recv(1) == b""


def _raw_get(host: str, port: int, target: str) -> bytes:
    """One HTTP/1.1 GET with the target exactly as given (no client normalises it)."""
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    return data


def test_nginx_with_default_settings_merges_slashes_before_dot_segments(tmp_path: Path) -> None:
    with NginxServer(tmp_path / "nginx") as nginx:
        assert nginx.process is not None
        pid = nginx.process.pid
        assert _raw_get(nginx.host, nginx.port, "/v1/x").endswith(b"v1 /v1/x\n")
        assert _raw_get(nginx.host, nginx.port, "/v1//../admin").endswith(b"admin /admin\n")
        assert _raw_get(nginx.host, nginx.port, "/elsewhere").endswith(b"other /elsewhere\n")
        assert [(r.raw, r.uri, r.location) for r in nginx.requests()] == [
            ("/v1/x", "/v1/x", "v1"),
            ("/v1//../admin", "/admin", "admin"),
            ("/elsewhere", "/elsewhere", "other"),
        ]
        nginx.reset()
        assert nginx.requests() == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_nginx_serves_https_with_the_test_pki(tmp_path: Path, pki: TestPKI) -> None:
    with NginxServer(tmp_path / "nginx", "127.0.0.1", tls=pki) as nginx:
        ctx = ssl.create_default_context(cafile=str(pki.ca_file))
        with httpx.Client(verify=ctx, timeout=5) as client:
            resp = client.get(f"https://{nginx.host}:{nginx.tls_port}/admin/x")
        assert (resp.status_code, resp.text, resp.headers["X-Location"]) == (200, "admin /admin/x\n", "admin")
