"""The gates in process (taddons, tflow): allowed, denied, fail closed, one record per decision."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TOKEN, tenant_yaml
from mitmproxy import flow as mflow
from mitmproxy import http
from mitmproxy.proxy.layers.http._hooks import HttpConnectHook, HttpRequestHeadersHook, HttpResponseHook
from mitmproxy.proxy.layers.tcp import TcpStartHook
from mitmproxy.proxy.server_hooks import ServerConnectHook
from mitmproxy.test import tflow
from support.inprocess import InProcess, connect_flow, in_process, proxy_flow, server_connect

from sandgate.proxy.addons.audit_completion import AuditCompletion
from sandgate.proxy.addons.dial_guard import DialGuard
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.identify import Identify
from sandgate.proxy.addons.limits import TenantLimits
from sandgate.proxy.addons.request_gate import RequestGate
from sandgate.proxy.addons.tunnel_gate import TunnelGate

HOSTS = {"api.test": ["127.0.0.2"], "other.test": ["127.0.0.3"], "raw.test": ["127.0.0.2"]}
PORT = 8080
RULES = [
    {"id": "api", "hosts": ["api.test"], "ports": [PORT]},
    {"id": "raw", "hosts": ["raw.test"], "ports": [5432], "protocol": "tcp"},
]


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[InProcess]:
    with in_process(
        tmp_path,
        {"t1.yaml": tenant_yaml("t1", RULES)},
        HOSTS,
        {Identify, TunnelGate, RequestGate, DialGuard, TenantLimits, AuditCompletion},
    ) as running:
        yield running


async def request(gw: InProcess, url: str, **kwargs: object) -> http.HTTPFlow:
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(client, url, sandbox="sb1", token=TOKEN, **kwargs)  # type: ignore[arg-type]
    await gw.hook(HttpRequestHeadersHook(flow))
    return flow


async def test_an_allowed_request_is_pinned_and_recorded_once_when_it_ends(gw: InProcess) -> None:
    flow = await request(gw, f"http://api.test:{PORT}/v1/x?token=abc")
    assert flow.response is None
    assert flow.request.host == "127.0.0.2"  # dialled at the checked address
    assert gw.ctx.connections[flow.client_conn.id].dial_permits == {("127.0.0.2", PORT): "api.test"}
    assert Exchange.of(flow).pending[1].allowed  # type: ignore[index]  # recorded when the exchange ends, not before
    flow.response = http.Response.make(200, b"hello")
    await gw.hook(HttpResponseHook(flow))
    (record,) = gw.records()
    assert (record["decision"], record["reason"], record["rule_id"]) == ("allow", "allowed", "t1/allow/api")
    assert (record["tenant"], record["sandbox"], record["status"]) == ("t1", "sb1", 200)
    assert record["dest"] == {"host": "api.test", "ip": "127.0.0.2", "port": PORT, "sni": None}
    assert record["path"] == "/v1/x?token=REDACTED"
    assert record["bytes"]["down"] == 5


@pytest.mark.parametrize(
    ("url", "headers", "reason"),
    [
        (f"http://other.test:{PORT}/", {}, "host_not_allowed"),
        (f"http://api.test:{PORT + 1}/", {}, "port_not_allowed"),
        (f"http://api.test:{PORT}/", {"Host": "other.test"}, "host_mismatch"),
    ],
    ids=["a host no rule names", "a port the rule does not list", "a Host header naming another host"],
)
async def test_a_denied_request_gets_403_and_exactly_one_deny_record(
    gw: InProcess, url: str, headers: dict[str, str], reason: str
) -> None:
    flow = await request(gw, url, headers=headers)
    assert flow.response is not None and flow.response.status_code == 403
    assert flow.response.headers["X-Sandgate-Reason"] == reason
    assert Exchange.of(flow).pending is None
    await gw.hook(HttpResponseHook(flow))  # the exchange ends: no second record
    (record,) = gw.records()
    assert (record["decision"], record["reason"]) == ("deny", reason)
    assert record["decision_id"] == flow.response.headers["X-Sandgate-Decision-Id"]


async def test_a_request_on_a_connection_the_gateway_never_saw_is_denied_internal_error(
    gw: InProcess,
) -> None:
    # No client_connected: the request gate's hook fails on the missing state, and denies (fail closed).
    flow = proxy_flow(tflow.tclient_conn(), f"http://api.test:{PORT}/", sandbox="sb1", token=TOKEN)
    await gw.hook(HttpRequestHeadersHook(flow))
    assert flow.response is not None and flow.response.status_code == 403
    assert flow.response.headers["X-Sandgate-Reason"] == "internal_error"
    (record,) = gw.records()
    assert (record["decision"], record["reason"], record["detail"]) == (
        "deny",
        "internal_error",
        "hook failed",
    )


async def test_an_allowed_connect_stays_open_with_one_allow_record_and_no_deny(gw: InProcess) -> None:
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = connect_flow(client, "raw.test", 5432, sandbox="sb1", token=TOKEN)
    await gw.hook(HttpConnectHook(flow))
    assert flow.response is None
    state = gw.ctx.connections[client.id]
    assert (state.tunnel_host, state.tunnel_port, state.denied) == ("raw.test", 5432, None)
    data = server_connect(client, ("127.0.0.2", 5432))
    await gw.hook(ServerConnectHook(data))
    assert data.server.error is None and data.server.sni == "raw.test"
    tcp = tflow.ttcpflow(client_conn=client, server_conn=data.server)
    await gw.hook(TcpStartHook(tcp))
    assert tcp.error is None
    (record,) = gw.records()
    assert (record["phase"], record["decision"], record["rule_id"]) == ("connect", "allow", "t1/allow/raw")


async def test_a_denied_connect_refuses_and_blocks_every_later_upstream(gw: InProcess) -> None:
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = connect_flow(client, "other.test", 443, sandbox="sb1", token=TOKEN)
    await gw.hook(HttpConnectHook(flow))
    assert flow.response is not None and flow.response.status_code == 403
    data = server_connect(client, ("127.0.0.3", 443))
    await gw.hook(ServerConnectHook(data))
    assert data.server.error == "sandgate: host_not_allowed"
    (record,) = gw.records()
    assert (record["phase"], record["decision"], record["reason"]) == ("connect", "deny", "host_not_allowed")


async def test_raw_bytes_no_rule_approved_are_killed_and_recorded_once(gw: InProcess) -> None:
    client = tflow.tclient_conn()
    await gw.connect(client)
    tcp = tflow.ttcpflow(client_conn=client)
    await gw.hook(TcpStartHook(tcp))
    assert tcp.error is not None and tcp.error.msg == mflow.Error.KILLED_MESSAGE
    assert gw.ctx.connections[client.id].denied is not None
    (record,) = gw.records()
    assert (record["decision"], record["reason"]) == ("deny", "protocol_not_allowed")


async def test_an_upstream_the_connection_was_not_approved_for_is_never_dialled(gw: InProcess) -> None:
    flow = await request(gw, f"http://api.test:{PORT}/")
    data = server_connect(flow.client_conn, ("127.0.0.3", PORT))
    await gw.hook(ServerConnectHook(data))
    assert data.server.error == "sandgate: destination not approved"
