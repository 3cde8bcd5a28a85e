"""The passthrough front (proxy/front/) against a real gateway, real TLS upstreams and real clients.

Each test says what crossed the front: tunnels it spliced itself and connections it handed to
mitmproxy are counted in /metrics (`sandgate_front_tunnels_total`, `..._handoffs_total`), so a
test of the fast path fails if the tunnel quietly took mitmproxy's path, and the other way round.
"""

from __future__ import annotations

import base64
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import TOKEN, UPSTREAM_IP, GatewayFactory, RunningGateway, tenant_yaml
from support import RecordingUpstream, TestPKI
from support.tunnels import counters, https_get, open_tunnel, read_head

pytestmark = pytest.mark.slow

# What an audit record says about a decision, without what differs per run or connection.
# `prev`: each trail chains its own lines (docs/operations/audit.md, tamper evidence).
_VOLATILE = ("time", "decision_id", "client", "duration_ms", "worker", "prev")


@pytest.fixture(scope="module")
def tls_upstream(pki: TestPKI) -> Iterator[RecordingUpstream]:
    with RecordingUpstream(UPSTREAM_IP, tls=pki, name="front-upstream") as up:
        yield up


def _rules(port: int) -> list[dict[str, Any]]:
    return [
        {"id": "pass", "hosts": ["pass.test"], "ports": [port]},
        {"id": "api", "hosts": ["api.test"], "ports": [port], "inspect": True},
    ]


@pytest.fixture(scope="module")
def shared(start_module_gateway: GatewayFactory, tls_upstream: RecordingUpstream) -> RunningGateway:
    return start_module_gateway({"t1.yaml": tenant_yaml("t1", _rules(tls_upstream.port))})


@pytest.fixture
def gw(shared: RunningGateway, tls_upstream: RecordingUpstream) -> RunningGateway:
    shared.mark()
    tls_upstream.reset()
    return shared


def stable(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in _VOLATILE}


def test_an_allowed_passthrough_tunnel_is_spliced_by_the_front(
    gw: RunningGateway, tls_upstream: RecordingUpstream, pki: TestPKI
) -> None:
    before = counters(gw)
    data = https_get(open_tunnel(gw, f"pass.test:{tls_upstream.port}"), "pass.test", str(pki.ca_file))
    assert data.startswith(b"HTTP/1.1 200")
    assert [c.sni for c in tls_upstream.connections] == ["pass.test"], "one connection, the guest's SNI"
    assert [r.target for r in tls_upstream.requests] == ["/front"]
    after = counters(gw)
    assert after[0] == before[0] + 1 and after[1] == before[1], "spliced by the front, not handed on"
    records = gw.records(2)
    assert [(r["phase"], r["decision"], r["rule_id"], r["dest"]["sni"]) for r in records] == [
        ("connect", "allow", "t1/allow/pass", None),
        ("tls", "allow", "t1/allow/pass", "pass.test"),
    ]
    assert records[0]["dest"] == {
        "host": "pass.test",
        "ip": UPSTREAM_IP,
        "port": tls_upstream.port,
        "sni": None,
    }
    assert records[0]["sandbox"] == "sb1" and records[0]["tenant"] == "t1"


def test_the_front_writes_the_records_mitmproxys_path_writes(
    gw: RunningGateway,
    start_gateway: GatewayFactory,
    tls_upstream: RecordingUpstream,
    pki: TestPKI,
) -> None:
    """The same tunnel through a gateway without the front: the same two records, field for field."""
    https_get(open_tunnel(gw, f"pass.test:{tls_upstream.port}"), "pass.test", str(pki.ca_file))
    fronted = [stable(r) for r in gw.records(2)]
    plain = start_gateway(
        {"t1.yaml": tenant_yaml("t1", _rules(tls_upstream.port))}, config={"passthrough": {"front": False}}
    )
    https_get(open_tunnel(plain, f"pass.test:{tls_upstream.port}"), "pass.test", str(pki.ca_file))
    unfronted = [stable(r) for r in plain.records(2)]
    for a, b in zip(fronted, unfronted, strict=True):
        a.pop("listener"), b.pop("listener")  # each gateway's own port
        a.pop("policy_version"), b.pop("policy_version")
    assert fronted == unfronted
    assert counters(plain) == (0, 0), "with `passthrough.front: false` the front reads nothing"


def test_an_intercepted_tunnel_is_handed_to_mitmproxy(
    gw: RunningGateway, tls_upstream: RecordingUpstream, pki: TestPKI
) -> None:
    before = counters(gw)
    # The gateway's CA signs the leaf the guest sees: the request inside is decided and recorded.
    data = https_get(open_tunnel(gw, f"api.test:{tls_upstream.port}"), "api.test", str(gw.ca_file), "/seen")
    assert data.startswith(b"HTTP/1.1 200")
    after = counters(gw)
    assert after[0] == before[0] and after[1] == before[1] + 1
    records = gw.records(3)
    assert [(r["phase"], r["decision"]) for r in records] == [
        ("connect", "allow"),
        ("tls", "allow"),
        ("request", "allow"),
    ]
    assert records[2]["path"] == "/seen"


@pytest.mark.parametrize(
    ("target", "token", "status", "reason"),
    [
        ("pass.test:{port}", "wrong-token", b"407", "no_identity"),
        ("other.test:{port}", TOKEN, b"403", "host_not_allowed"),
        ("pass.test:1", TOKEN, b"403", "port_not_allowed"),
    ],
    ids=["a wrong credential", "a host no rule allows", "a port no rule allows"],
)
def test_a_refusal_is_mitmproxys_answer_with_its_one_record(
    gw: RunningGateway, tls_upstream: RecordingUpstream, target: str, token: str, status: bytes, reason: str
) -> None:
    before = counters(gw)
    auth = base64.b64encode(f"sb1:{token}".encode()).decode()
    t = target.format(port=tls_upstream.port)
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as raw:
        raw.sendall(
            f"CONNECT {t} HTTP/1.1\r\nHost: {t}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        answer = read_head(raw)
    assert answer.split(b" ")[1] == status, answer
    (record,) = gw.records(1)
    assert (record["decision"], record["reason"]) == ("deny", reason)
    assert tls_upstream.connections == []
    assert counters(gw)[1] == before[1] + 1


def test_a_client_hello_naming_another_host_is_refused_by_the_front(
    gw: RunningGateway, tls_upstream: RecordingUpstream, pki: TestPKI
) -> None:
    before = counters(gw)
    raw = open_tunnel(gw, f"pass.test:{tls_upstream.port}")
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    ctx.check_hostname = False
    with pytest.raises((ssl.SSLError, OSError)), ctx.wrap_socket(raw, server_hostname="other.test") as tls:
        tls.recv(1)
    records = gw.records(2)
    assert [(r["phase"], r["decision"], r["reason"]) for r in records] == [
        ("connect", "allow", "allowed"),
        ("tls", "deny", "sni_mismatch"),
    ]
    assert records[1]["dest"]["sni"] == "other.test"
    assert tls_upstream.connections == [], "nothing dialled for a refused ClientHello"
    assert counters(gw) == before, "refused by the front itself: neither spliced nor handed on"


def test_plain_http_in_an_allowed_tunnel_is_decided_by_mitmproxy_and_recorded_once(
    start_gateway: GatewayFactory, pki: TestPKI
) -> None:
    """The front answered the CONNECT before it saw the tunnel is not TLS: mitmproxy gets the
    CONNECT again, its 200 is not sent twice, and the CONNECT has one record."""
    with RecordingUpstream(UPSTREAM_IP, name="plain-in-tunnel") as plain_up:
        gw = start_gateway({"t1.yaml": tenant_yaml("t1", _rules(plain_up.port))})
        before = counters(gw)
        raw = open_tunnel(gw, f"pass.test:{plain_up.port}")
        with raw:
            raw.sendall(b"GET /inner HTTP/1.1\r\nHost: pass.test\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := raw.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 200 OK"), data[:200]
        assert b"Connection established" not in data, "the guest got one answer to its CONNECT"
        assert [r.target for r in plain_up.requests] == ["/inner"]
        records = gw.records(2)
        time.sleep(0.3)
        records = gw.records()
        assert [(r["phase"], r["decision"]) for r in records] == [("connect", "allow"), ("request", "allow")]
        after = counters(gw)
        assert after == (before[0], before[1] + 1)


def test_a_connect_head_sent_in_slow_pieces_is_handed_on_and_still_works(
    gw: RunningGateway, tls_upstream: RecordingUpstream, pki: TestPKI
) -> None:
    before = counters(gw)
    raw = open_tunnel(gw, f"pass.test:{tls_upstream.port}", head_in=3)
    data = https_get(raw, "pass.test", str(pki.ca_file))
    assert data.startswith(b"HTTP/1.1 200")
    assert counters(gw) == (before[0], before[1] + 1)
    assert [(r["phase"], r["decision"]) for r in gw.records(2)] == [("connect", "allow"), ("tls", "allow")]


def test_a_client_hello_in_pieces_is_read_whole(
    gw: RunningGateway, tls_upstream: RecordingUpstream, pki: TestPKI
) -> None:
    """A ClientHello split over several writes is put together before it is judged."""
    raw = open_tunnel(gw, f"pass.test:{tls_upstream.port}")
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="pass.test")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    for i in range(0, len(hello), 40):
        raw.sendall(hello[i : i + 40])
        time.sleep(0.02)
    # The handshake completes through the tunnel: the upstream got the whole ClientHello.
    raw.settimeout(10)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            if out := outgoing.read():
                raw.sendall(out)
            chunk = raw.recv(65536)
            assert chunk, "the tunnel closed during the handshake"
            incoming.write(chunk)
    tls.write(b"GET /pieces HTTP/1.1\r\nHost: pass.test\r\nConnection: close\r\n\r\n")
    raw.sendall(outgoing.read())
    answer = b""
    while chunk := raw.recv(65536):
        incoming.write(chunk)
        try:
            answer += tls.read(65536)
        except ssl.SSLWantReadError:
            continue
        if b"\r\n\r\n" in answer:
            break
    raw.close()
    assert answer.startswith(b"HTTP/1.1 200")
    assert [r.target for r in tls_upstream.requests] == ["/pieces"]
    assert [c.sni for c in tls_upstream.connections] == ["pass.test"]
    assert [(r["phase"], r["decision"]) for r in gw.records(2)] == [("connect", "allow"), ("tls", "allow")]
