"""Host binding on the whole pipeline in process: a request inside an approved tunnel must
name the tunnel's host, in its Host header and in an absolute-form target, or it is refused
`host_mismatch` (403, one record) and goes nowhere."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TOKEN, tenant_yaml
from mitmproxy import connection, http
from mitmproxy.proxy.layers.http._hooks import HttpConnectHook, HttpRequestHeadersHook, HttpRequestHook
from mitmproxy.test import tflow
from support.inprocess import connect_flow, proxy_flow
from support.whole_pipeline import Pipeline, whole_pipeline

HOSTS = {"api.test": ["127.0.0.2"], "other.test": ["127.0.0.3"]}
# Both hosts are allowed: a mismatch is refused for naming another host, not a denied one.
RULES = [
    {"id": "api", "hosts": ["api.test"], "ports": [443], "inspect": True},
    {"id": "other", "hosts": ["other.test"], "ports": [443], "inspect": True},
]


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Pipeline]:
    with whole_pipeline(tmp_path, {"t1.yaml": tenant_yaml("t1", RULES)}, HOSTS) as running:
        yield running


async def tunnel(gw: Pipeline) -> connection.Client:
    """A connection with an intercepted tunnel to api.test:443 (CONNECT, then its ClientHello)."""
    client = tflow.tclient_conn()
    await gw.connect(client)
    connect = connect_flow(client, "api.test", 443, sandbox="sb1", token=TOKEN)
    await gw.hook(HttpConnectHook(connect))
    assert connect.response is None
    hello = await gw.hello(client, "api.test")
    assert not hello.ignore_connection  # intercepted: its requests are seen and decided
    return client


async def in_tunnel(
    gw: Pipeline, client: connection.Client, url: str, host_header: str, *, absolute: bool = False
) -> http.HTTPFlow:
    """A request on the tunnel's intercepted TLS (as mitmproxy hands it over), through its hooks;
    `absolute`: its target in absolute form (`GET http://host:port/path`), as the client sent it."""
    request = http.Request.make("GET", url)
    request.headers["Host"] = host_header
    if absolute:
        request.authority = f"{request.host}:{request.port}"  # what mitmproxy's parser keeps
    flow = tflow.tflow(client_conn=client)
    flow.request = request
    await gw.hook(HttpRequestHeadersHook(flow))
    if flow.response is None:
        await gw.hook(HttpRequestHook(flow))
    return flow


@pytest.mark.parametrize(
    ("url", "absolute"),
    [("https://api.test/v1", False), ("http://api.test:443/v1", True)],
    ids=["in origin form", "in absolute form naming the tunnel's host and port"],
)
async def test_a_request_naming_the_tunnel_host_goes_on_as_allowed(
    gw: Pipeline, url: str, absolute: bool
) -> None:
    client = await tunnel(gw)
    flow = await in_tunnel(gw, client, url, "api.test", absolute=absolute)
    assert flow.response is None
    assert await gw.dial(client, ("127.0.0.2", 443)) is None
    connect, hello = gw.records()  # the request's own record comes when its exchange ends
    assert (connect["phase"], connect["decision"]) == ("connect", "allow")
    assert (hello["phase"], hello["decision"]) == ("tls", "allow")


async def test_a_host_header_naming_another_host_in_a_tunnel_is_host_mismatch(gw: Pipeline) -> None:
    client = await tunnel(gw)
    flow = await in_tunnel(gw, client, "https://api.test/v1", "other.test")
    assert flow.response is not None and flow.response.status_code == 403
    assert flow.response.headers["X-Sandgate-Reason"] == "host_mismatch"
    # other.test is allowed on its own, but this connection never was approved for it.
    assert await gw.dial(client, ("127.0.0.3", 443)) is not None
    *_, record = gw.records()
    assert (record["phase"], record["decision"], record["reason"]) == ("request", "deny", "host_mismatch")
    assert record["dest"]["host"] == "api.test"
    assert record["decision_id"] == flow.response.headers["X-Sandgate-Decision-Id"]


async def test_an_absolute_form_target_naming_another_host_in_a_tunnel_is_host_mismatch(
    gw: Pipeline,
) -> None:
    # Host names the tunnel's host, but servers obey the absolute-form target over Host.
    client = await tunnel(gw)
    flow = await in_tunnel(gw, client, "http://other.test:443/v1", "api.test", absolute=True)
    assert flow.response is not None and flow.response.status_code == 403
    assert flow.response.headers["X-Sandgate-Reason"] == "host_mismatch"
    *_, record = gw.records()
    assert (record["decision"], record["reason"]) == ("deny", "host_mismatch")
    assert record["detail"] == "the request target does not name the approved destination"


async def test_a_host_header_naming_another_host_than_the_proxy_request_is_host_mismatch(
    gw: Pipeline,
) -> None:
    client = tflow.tclient_conn()
    await gw.connect(client)
    url, host = "http://api.test:443/v1", "other.test:443"
    flow = proxy_flow(client, url, sandbox="sb1", token=TOKEN, headers={"Host": host})
    await gw.hook(HttpRequestHeadersHook(flow))
    assert flow.response is not None and flow.response.status_code == 403
    assert flow.response.headers["X-Sandgate-Reason"] == "host_mismatch"
    assert await gw.dial(client, ("127.0.0.2", 443)) is not None
    assert await gw.dial(client, ("127.0.0.3", 443)) is not None
    (record,) = gw.records()
    assert (record["decision"], record["reason"]) == ("deny", "host_mismatch")
