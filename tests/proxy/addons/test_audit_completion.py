"""AuditCompletion in process: an allowed exchange's one record, written when it ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TOKEN, tenant_yaml
from mitmproxy import flow as mflow
from mitmproxy import http
from mitmproxy.proxy.layers.http._hooks import HttpErrorHook, HttpRequestHeadersHook, HttpResponseHook
from mitmproxy.test import tflow
from support.inprocess import InProcess, in_process, proxy_flow

from sandgate.proxy.addons.audit_completion import AuditCompletion
from sandgate.proxy.addons.dial_guard import DialGuard
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.identify import Identify
from sandgate.proxy.addons.request_gate import RequestGate
from sandgate.proxy.addons.tunnel_gate import TunnelGate

HOSTS = {"api.test": ["127.0.0.2"]}
PORT = 8080


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[InProcess]:
    tenants = {"t1.yaml": tenant_yaml("t1", [{"id": "api", "hosts": ["api.test"], "ports": [PORT]}])}
    with in_process(
        tmp_path, tenants, HOSTS, {Identify, TunnelGate, RequestGate, DialGuard, AuditCompletion}
    ) as running:
        yield running


async def allowed(gw: InProcess, content: bytes = b"") -> http.HTTPFlow:
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(
        client, f"http://api.test:{PORT}/x", method="POST", sandbox="sb1", token=TOKEN, content=content
    )
    await gw.hook(HttpRequestHeadersHook(flow))
    assert flow.response is None and Exchange.of(flow).pending is not None
    return flow


async def test_a_response_completes_the_record_with_status_bytes_and_credentials(gw: InProcess) -> None:
    flow = await allowed(gw, b"12345")
    Exchange.of(flow).credentials, Exchange.of(flow).injectors = ("gh",), ("bearer",)
    flow.response = http.Response.make(201, b"created!")
    await gw.hook(HttpResponseHook(flow))
    await gw.hook(HttpResponseHook(flow))  # a second end (no pending decision): nothing more
    (record,) = gw.records()
    assert (record["decision"], record["status"], record["credentials"]) == ("allow", 201, ["gh"])
    assert record["injectors"] == ["bearer"]
    assert record["bytes"]["down"] == 8 and record["bytes"]["up"] > 5
    assert record["error"] is None


async def test_an_upstream_failure_after_the_allow_records_its_reason_and_status(gw: InProcess) -> None:
    flow = await allowed(gw)
    flow.error = mflow.Error("server closed connection")
    await gw.hook(HttpErrorHook(flow))
    (record,) = gw.records()
    assert (record["decision"], record["reason"]) == ("allow", "upstream_protocol_error")
    assert (record["status"], record["error"]) == (502, "upstream closed the connection")


async def test_a_failure_another_addon_flagged_is_the_records_error(gw: InProcess) -> None:
    flow = await allowed(gw)
    Exchange.of(flow).failure = "HTTP/1 trailers cannot be relayed"
    flow.response = http.Response.make(200, b"")
    await gw.hook(HttpResponseHook(flow))
    (record,) = gw.records()
    assert (record["reason"], record["status"]) == ("allowed", 200)
    assert record["error"] == "HTTP/1 trailers cannot be relayed"


async def test_a_flow_the_gate_never_allowed_gets_no_completion_record(gw: InProcess) -> None:
    flow = tflow.tflow(resp=True)
    await gw.hook(HttpResponseHook(flow))
    await gw.hook(HttpErrorHook(tflow.tflow(err=True)))
    assert gw.records() == []
