"""Refusals after the gates allowed, in process: a response head over the cap, an unapproved 101.

Each keeps the allowing decision's rule (Decision.as_denial), answers before it records
(refuse), and leaves the exchange exactly one record.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TOKEN, tenant_yaml
from mitmproxy import http
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.proxy.layers.http._hooks import (
    HttpRequestHeadersHook,
    HttpResponseHeadersHook,
    HttpResponseHook,
)
from mitmproxy.test import tflow
from support.inprocess import InProcess, in_process, proxy_flow

from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.audit_completion import AuditCompletion
from sandgate.proxy.addons.dial_guard import DialGuard
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.heads import HeadGuard, refused_response
from sandgate.proxy.addons.identify import Identify
from sandgate.proxy.addons.pipeline import Shared
from sandgate.proxy.addons.request_gate import RequestGate
from sandgate.proxy.addons.tunnel_gate import TunnelGate
from sandgate.proxy.addons.upgrades import Upgrades
from sandgate.proxy.mitm.closer import ConnectionCloser

PORT = 8080


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[InProcess]:
    tenants = {"t1.yaml": tenant_yaml("t1", [{"id": "api", "hosts": ["api.test"], "ports": [PORT]}])}
    # In the pipeline's order: head caps and upgrades before the gates, completion after them.
    chain = {Identify, HeadGuard, Upgrades, TunnelGate, RequestGate, DialGuard, AuditCompletion}
    shared = Shared(closer=ConnectionCloser(Proxyserver()))
    with in_process(tmp_path, tenants, {"api.test": ["127.0.0.2"]}, chain, shared=shared) as running:
        yield running


async def allowed(gw: InProcess) -> http.HTTPFlow:
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(client, f"http://api.test:{PORT}/chat", sandbox="sb1", token=TOKEN)
    await gw.hook(HttpRequestHeadersHook(flow))
    assert flow.response is None and Exchange.of(flow).pending is not None
    return flow


async def test_a_response_head_over_the_cap_is_502_with_one_deny_record_keeping_the_rule(
    gw: InProcess,
) -> None:
    flow = await allowed(gw)
    flow.response = refused_response(502, Reason.HEADER_TOO_LARGE, None, "max_lines")
    await gw.hook(HttpResponseHook(flow))
    assert flow.response.status_code == 502
    (record,) = gw.records()
    assert (record["decision"], record["reason"], record["status"]) == ("deny", "header_too_large", 502)
    assert (record["rule_id"], record["dest"]["ip"]) == ("t1/allow/api", "127.0.0.2")
    assert record["detail"] == "response head over 100 lines"
    assert record["decision_id"] == flow.response.headers["X-Sandgate-Decision-Id"]


async def test_an_unapproved_101_is_answered_403_with_one_deny_record_keeping_the_rule(gw: InProcess) -> None:
    flow = await allowed(gw)
    flow.response = http.Response.make(101, b"", {"Upgrade": "foo", "Connection": "upgrade"})
    await gw.hook(HttpResponseHeadersHook(flow))
    assert flow.response.status_code == 403
    assert flow.response.headers["X-Sandgate-Reason"] == "upgrade_not_allowed"
    await gw.hook(HttpResponseHook(flow))  # the exchange ends: still the refusal, no second record
    assert flow.response.status_code == 403
    (record,) = gw.records()
    assert (record["decision"], record["reason"], record["status"]) == ("deny", "upgrade_not_allowed", 403)
    assert record["rule_id"] == "t1/allow/api"
    assert record["detail"] == "the upstream switched protocols without the gateway's approval"
