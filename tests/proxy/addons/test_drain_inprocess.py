"""The drain on the whole pipeline in process: a request that starts while the gateway drains
is answered 503 (try again shortly) with one record and goes nowhere; one in flight when the
drain ends is recorded once, as cut."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TOKEN, tenant_yaml
from mitmproxy import http
from mitmproxy.proxy.layers.http._hooks import HttpRequestHeadersHook, HttpRequestHook, HttpResponseHook
from mitmproxy.test import tflow
from support.inprocess import proxy_flow
from support.whole_pipeline import Pipeline, whole_pipeline

PORT = 8080
URL = f"http://api.test:{PORT}/v1"


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Pipeline]:
    tenants = {"t1.yaml": tenant_yaml("t1", [{"id": "api", "hosts": ["api.test"], "ports": [PORT]}])}
    with whole_pipeline(tmp_path, tenants, {"api.test": ["127.0.0.2"]}) as running:
        yield running


async def request(gw: Pipeline) -> http.HTTPFlow:
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(client, URL, sandbox="sb1", token=TOKEN)
    await gw.hook(HttpRequestHeadersHook(flow))
    if flow.response is None:
        await gw.hook(HttpRequestHook(flow))
    return flow


async def test_a_request_that_starts_while_draining_gets_503_and_one_record(gw: Pipeline) -> None:
    await gw.drainer.drain(0)
    flow = await request(gw)
    assert flow.response is not None and flow.response.status_code == 503
    assert flow.response.headers["X-Sandgate-Reason"] == "internal_error"
    assert (flow.response.headers["Retry-After"], flow.response.headers["Connection"]) == ("1", "close")
    # Allowed by the policy, but nothing goes upstream for it.
    assert await gw.dial(flow.client_conn, ("127.0.0.2", PORT)) is not None
    await gw.hook(HttpResponseHook(flow))
    (record,) = gw.records()
    assert (record["decision"], record["reason"], record["status"]) == ("deny", "internal_error", 503)
    assert record["detail"] == "gateway shutting down"
    assert (record["tenant"], record["sandbox"], record["path"]) == ("t1", "sb1", "/v1")
    assert record["decision_id"] == flow.response.headers["X-Sandgate-Decision-Id"]


async def test_a_request_in_flight_when_the_drain_ends_is_recorded_once_as_cut(gw: Pipeline) -> None:
    flow = await request(gw)
    assert flow.response is None  # allowed, waiting for its upstream
    await gw.drainer.drain(0)
    # Its connection is closed; should its answer still arrive, it is not recorded again.
    flow.response = http.Response.make(200, b"late")
    await gw.hook(HttpResponseHook(flow))
    (record,) = gw.records()
    assert (record["decision"], record["reason"], record["error"]) == ("allow", "allowed", "cut by shutdown")
    assert record["rule_id"] == "t1/allow/api"
