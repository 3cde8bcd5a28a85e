"""Passthrough tunnels to a host allowed by name need an SNI that names it (no domain fronting).

Without SNI a server picks its default site and routes by the inner Host, which a passthrough
tunnel hides from the gateway: `CONNECT pass.test` + no SNI + `Host: other.test` would reach
whatever the pinned server hosts as other.test.
"""

from __future__ import annotations

import base64
import socket
import ssl
from typing import Any

import pytest
from conftest import TOKEN, UPSTREAM_IP, GatewayFactory, RunningGateway, tenant_yaml
from support import RecordingUpstream, TestPKI

pytestmark = pytest.mark.slow


def _rules(port: int) -> list[dict[str, Any]]:
    return [
        {"id": "pass", "hosts": ["pass.test"], "ports": [port]},
        {"id": "api", "hosts": ["api.test"], "ports": [port], "inspect": True},
        {"id": "by-ip", "cidrs": [f"{UPSTREAM_IP}/32"], "ports": [port]},
    ]


@pytest.fixture(scope="module")
def shared_gateway(start_module_gateway: GatewayFactory, https_upstream: RecordingUpstream) -> RunningGateway:
    return start_module_gateway({"t1.yaml": tenant_yaml("t1", _rules(https_upstream.port))})


@pytest.fixture
def gw(shared_gateway: RunningGateway) -> RunningGateway:
    """The module's gateway with the default passthrough settings; `records()` shows this test's."""
    shared_gateway.mark()
    return shared_gateway


@pytest.fixture(scope="module")
def shared_guarded_gateway(
    start_module_gateway: GatewayFactory, https_upstream: RecordingUpstream
) -> RunningGateway:
    # The upstream's loopback address is internal: the operator opens it for the cidr rule.
    guard = {"address_guard": {"tenant_reachable": [f"{UPSTREAM_IP}/32"]}}
    return start_module_gateway({"t1.yaml": tenant_yaml("t1", _rules(https_upstream.port))}, config=guard)


def _tunnel(gw: RunningGateway, target: str) -> socket.socket:
    auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    raw = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    raw.sendall(
        f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = raw.recv(4096)
        assert chunk, "the gateway closed the CONNECT"
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head
    return raw


def _fronted_get(
    gw: RunningGateway, target: str, sni: str | None, cafile: str, *, inner_host: str = "other.test"
) -> bytes:
    """TLS through a CONNECT tunnel with the given SNI (None: none sent), then a GET for `inner_host`."""
    raw = _tunnel(gw, target)
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.check_hostname = False  # the SNI under test need not match the certificate
    try:
        with ctx.wrap_socket(raw, server_hostname=sni) as tls:
            tls.sendall(f"GET /fronted HTTP/1.1\r\nHost: {inner_host}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
            return data
    finally:
        raw.close()


def test_a_passthrough_tunnel_without_sni_is_refused(
    gw: RunningGateway, https_upstream: RecordingUpstream, pki: TestPKI
) -> None:
    with pytest.raises((ssl.SSLError, OSError)):
        _fronted_get(gw, f"pass.test:{https_upstream.port}", None, str(pki.ca_file))
    records = gw.records(2)
    assert [(r["phase"], r["decision"], r["reason"]) for r in records] == [
        ("connect", "allow", "allowed"),
        ("tls", "deny", "sni_mismatch"),
    ]
    assert records[1]["dest"]["sni"] is None
    assert https_upstream.connections == [], "the pinned server never saw the fronted request"


@pytest.mark.parametrize("sni", ["PASS.TEST", "pass.test."], ids=["in upper case", "with a trailing dot"])
def test_an_sni_naming_the_host_in_another_spelling_is_the_same_name(
    gw: RunningGateway, https_upstream: RecordingUpstream, pki: TestPKI, sni: str
) -> None:
    data = _fronted_get(gw, f"pass.test:{https_upstream.port}", sni, str(pki.ca_file), inner_host="pass.test")
    assert data.startswith(b"HTTP/1.1 200")
    assert [r["reason"] for r in gw.records(2)] == ["allowed", "allowed"]


def test_the_operator_can_admit_passthrough_clients_that_send_no_sni(
    start_gateway: GatewayFactory, https_upstream: RecordingUpstream, pki: TestPKI
) -> None:
    gw = start_gateway(
        {"t1.yaml": tenant_yaml("t1", _rules(https_upstream.port))},
        config={"passthrough": {"require_sni": False}},
    )
    data = _fronted_get(
        gw, f"pass.test:{https_upstream.port}", None, str(pki.ca_file), inner_host="pass.test"
    )
    assert data.startswith(b"HTTP/1.1 200")
    assert https_upstream.connections[0].sni is None


@pytest.mark.parametrize(
    ("target", "inner_host"),
    [("api.test", "api.test"), (UPSTREAM_IP, UPSTREAM_IP)],
    ids=["an intercepted tunnel (the gateway reads every Host)", "a tunnel to an address a cidr rule allows"],
)
def test_tunnels_the_gateway_can_still_judge_need_no_sni(
    shared_guarded_gateway: RunningGateway,
    https_upstream: RecordingUpstream,
    pki: TestPKI,
    target: str,
    inner_host: str,
) -> None:
    gw = shared_guarded_gateway
    cafile = str(gw.ca_file if target == "api.test" else pki.ca_file)
    port = https_upstream.port
    host_header = f"{inner_host}:{port}"
    data = _fronted_get(gw, f"{target}:{port}", None, cafile, inner_host=host_header)
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    (request,) = https_upstream.requests
    assert request.host == host_header
