"""TenantLimits in process: requests and tunnels counted after the gates allowed, one record each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import TOKEN, tenant_yaml
from mitmproxy import http
from mitmproxy.proxy.layers.http._hooks import (
    HttpConnectHook,
    HttpErrorHook,
    HttpRequestHeadersHook,
    HttpResponseHook,
)
from mitmproxy.proxy.server_hooks import ServerConnectHook
from mitmproxy.test import tflow
from support.inprocess import InProcess, connect_flow, in_process, proxy_flow, server_connect

from sandgate.proxy.addons.audit_completion import AuditCompletion
from sandgate.proxy.addons.dial_guard import DialGuard
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.identify import Identify
from sandgate.proxy.addons.limits import LimitStreamCut, TenantLimits
from sandgate.proxy.addons.request_gate import RequestGate
from sandgate.proxy.addons.tunnel_gate import TunnelGate

HOSTS = {"api.test": ["127.0.0.2"], "raw.test": ["127.0.0.2"]}
PORT = 8080
URL = f"http://api.test:{PORT}/upload"


def limited(**limits: int) -> str:
    rules = [
        {"id": "api", "hosts": ["api.test"], "ports": [PORT]},
        {"id": "raw", "hosts": ["raw.test"], "ports": [5432], "protocol": "tcp"},
    ]
    doc = yaml.safe_load(tenant_yaml("t1", rules))
    doc["limits"] = limits
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    stack: list[Any] = []

    def run(**limits: int) -> InProcess:
        cm = in_process(
            tmp_path,
            {"t1.yaml": limited(**limits)},
            HOSTS,
            {Identify, TunnelGate, RequestGate, DialGuard, TenantLimits, AuditCompletion},
        )
        stack.append(cm)
        return cm.__enter__()

    yield run
    for cm in stack:
        cm.__exit__(None, None, None)


async def send(gw: InProcess, **kwargs: Any) -> http.HTTPFlow:
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(client, URL, method="POST", sandbox="sb1", token=TOKEN, **kwargs)
    await gw.hook(HttpRequestHeadersHook(flow))
    if flow.response is None:
        flow.response = http.Response.make(200, b"ok")
    await gw.hook(HttpResponseHook(flow))
    return flow


async def test_the_request_over_requests_per_minute_gets_429_and_one_deny_record(start: Any) -> None:
    gw = start(requests_per_minute=1)
    first, second = await send(gw), await send(gw)
    assert first.response is not None and first.response.status_code == 200
    assert second.response is not None and second.response.status_code == 429
    assert second.response.headers["X-Sandgate-Reason"] == "rate_limited"
    assert second.response.headers["Retry-After"]
    allowed, denied = gw.records()
    assert (allowed["decision"], allowed["reason"]) == ("allow", "allowed")
    # The denial keeps the allowing decision's rule, version and address.
    assert (denied["decision"], denied["reason"], denied["detail"]) == (
        "deny",
        "rate_limited",
        "requests_per_minute",
    )
    assert (denied["rule_id"], denied["dest"]["ip"]) == ("t1/allow/api", "127.0.0.2")
    assert denied["policy_version"] == allowed["policy_version"]
    assert denied["decision_id"] == second.response.headers["X-Sandgate-Decision-Id"]


async def test_a_declared_body_over_request_body_bytes_gets_413(start: Any) -> None:
    gw = start(request_body_bytes=4)
    flow = await send(gw, content=b"0123456789")
    assert flow.response is not None and flow.response.status_code == 413
    (record,) = gw.records()
    assert (record["reason"], record["detail"]) == ("body_too_large", "request_body_bytes")


async def test_a_body_of_unknown_length_is_metered_and_cut_at_the_limit(start: Any) -> None:
    gw = start(request_body_bytes=8)
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(client, URL, method="POST", sandbox="sb1", token=TOKEN)
    del flow.request.headers["content-length"]
    flow.request.headers["Transfer-Encoding"] = "chunked"
    await gw.hook(HttpRequestHeadersHook(flow))
    meter = flow.request.stream
    assert callable(meter) and flow.response is None
    assert meter(b"12345") == b"12345"
    with pytest.raises(LimitStreamCut):
        meter(b"67890")
    refused = answer(flow)  # set by the meter's cut
    assert refused is not None and refused.status_code == 413
    assert Exchange.of(flow).pending is None
    await gw.hook(HttpErrorHook(flow))  # the cut exchange ends: no second record
    (record,) = gw.records()
    assert (record["reason"], record["detail"]) == (
        "body_too_large",
        "request_body_bytes (in a streamed body)",
    )


def answer(flow: http.HTTPFlow) -> http.Response | None:
    """The flow's response now (read through a call: a hook set it since the last check)."""
    return flow.response


async def test_a_fleet_sync_that_fails_denies_internal_error_and_records_once(start: Any) -> None:
    gw = start(requests_per_minute=10)

    async def redis_outage(tenant: str, sandbox: str, limits: object) -> None:
        raise ConnectionError("redis unreachable")

    gw.ctx.limit_learn = redis_outage
    flow = await send(gw)
    assert flow.response is not None and flow.response.status_code == 403
    assert flow.response.headers["X-Sandgate-Reason"] == "internal_error"
    (record,) = gw.records()
    assert (record["decision"], record["reason"], record["detail"]) == (
        "deny",
        "internal_error",
        "hook failed",
    )


async def test_a_raw_tunnel_over_the_limit_is_refused_at_dial_and_recorded(start: Any) -> None:
    gw = start(requests_per_minute=1)
    await send(gw)  # the minute's one request
    client = tflow.tclient_conn()
    await gw.connect(client)
    await gw.hook(HttpConnectHook(connect_flow(client, "raw.test", 5432, sandbox="sb1", token=TOKEN)))
    data = server_connect(client, ("127.0.0.2", 5432))
    await gw.hook(ServerConnectHook(data))
    assert data.server.error == "sandgate: rate_limited"
    assert gw.ctx.connections[client.id].denied is not None
    reasons = [(r["phase"], r["decision"], r["reason"]) for r in gw.records()]
    assert reasons == [
        ("request", "allow", "allowed"),
        ("connect", "allow", "allowed"),
        ("connect", "deny", "rate_limited"),
    ]


async def test_a_raw_tunnel_within_the_limit_opens_with_no_deny_record(start: Any) -> None:
    gw = start(requests_per_minute=5)
    client = tflow.tclient_conn()
    await gw.connect(client)
    await gw.hook(HttpConnectHook(connect_flow(client, "raw.test", 5432, sandbox="sb1", token=TOKEN)))
    data = server_connect(client, ("127.0.0.2", 5432))
    await gw.hook(ServerConnectHook(data))
    assert data.server.error is None
    assert [r["decision"] for r in gw.records()] == ["allow"]


async def test_a_request_refused_by_a_limit_leaves_no_dial_approval_behind(start: Any) -> None:
    gw = start(requests_per_minute=1)
    await send(gw)
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(client, URL, method="POST", sandbox="sb1", token=TOKEN)
    await gw.hook(HttpRequestHeadersHook(flow))
    assert flow.response is not None and flow.response.status_code == 429
    state = gw.ctx.connections.get(client.id)
    assert state is not None and state.dial_permits == {}


async def test_a_refused_request_keeps_what_its_connection_had_approved_before(start: Any) -> None:
    gw = start(requests_per_minute=1)
    client = tflow.tclient_conn()
    await gw.connect(client)
    for expected in (None, 429):
        flow = proxy_flow(client, URL, method="POST", sandbox="sb1", token=TOKEN)
        await gw.hook(HttpRequestHeadersHook(flow))
        assert (flow.response.status_code if flow.response else None) == expected
    state = gw.ctx.connections.get(client.id)
    assert state is not None and state.dial_permits == {("127.0.0.2", PORT): "api.test"}
