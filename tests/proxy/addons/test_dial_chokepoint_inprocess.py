"""The dial chokepoint on the whole pipeline in process: an upstream connection opens only to an
address this client connection was approved for, and never after a later layer denied on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TOKEN, tenant_yaml
from mitmproxy import flow as mflow
from mitmproxy.proxy.layers.http._hooks import HttpConnectHook, HttpRequestHeadersHook
from mitmproxy.proxy.layers.tcp import TcpStartHook
from mitmproxy.test import tflow
from support.inprocess import connect_flow, proxy_flow
from support.whole_pipeline import Pipeline, whole_pipeline

HOSTS = {"api.test": ["127.0.0.2"], "other.test": ["127.0.0.3"]}
PORT = 8080
RULES = [
    {"id": "api", "hosts": ["api.test"], "ports": [PORT, 443]},
    {"id": "other", "hosts": ["other.test"], "ports": [PORT]},
]


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Pipeline]:
    with whole_pipeline(tmp_path, {"t1.yaml": tenant_yaml("t1", RULES)}, HOSTS) as running:
        yield running


async def test_a_connection_that_was_approved_for_nothing_dials_nothing(gw: Pipeline) -> None:
    client = tflow.tclient_conn()
    await gw.connect(client)
    assert await gw.dial(client, ("127.0.0.2", PORT)) is not None
    assert gw.records() == []


@pytest.mark.parametrize(
    "address",
    [("127.0.0.3", PORT), ("127.0.0.2", PORT + 1)],
    ids=["another host's address (allowed on its own)", "the allowed address on another port"],
)
async def test_an_allowed_request_dials_its_checked_address_and_nothing_else(
    gw: Pipeline, address: tuple[str, int]
) -> None:
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(client, f"http://api.test:{PORT}/", sandbox="sb1", token=TOKEN)
    await gw.hook(HttpRequestHeadersHook(flow))
    assert flow.response is None
    assert await gw.dial(client, ("127.0.0.2", PORT)) is None
    assert await gw.dial(client, address) is not None


async def test_a_denied_connect_dials_nothing_not_even_an_address_allowed_elsewhere(gw: Pipeline) -> None:
    client = tflow.tclient_conn()
    await gw.connect(client)
    connect = connect_flow(client, "api.test", 5432, sandbox="sb1", token=TOKEN)
    await gw.hook(HttpConnectHook(connect))
    assert connect.response is not None and connect.response.status_code == 403
    assert await gw.dial(client, ("127.0.0.2", 5432)) == "sandgate: port_not_allowed"
    (record,) = gw.records()
    assert (record["phase"], record["decision"], record["reason"]) == ("connect", "deny", "port_not_allowed")


async def test_after_raw_bytes_a_tunnel_was_not_approved_for_its_upstream_is_never_dialled(
    gw: Pipeline,
) -> None:
    client = tflow.tclient_conn()
    await gw.connect(client)
    connect = connect_flow(client, "api.test", 443, sandbox="sb1", token=TOKEN)
    await gw.hook(HttpConnectHook(connect))
    assert connect.response is None
    assert await gw.dial(client, ("127.0.0.2", 443)) is None  # approved by the CONNECT
    # Bytes that are not TLS: no `protocol: tcp` rule approved raw bytes to api.test.
    tcp = tflow.ttcpflow(client_conn=client)
    await gw.hook(TcpStartHook(tcp))
    assert tcp.error is not None and tcp.error.msg == mflow.Error.KILLED_MESSAGE
    assert await gw.dial(client, ("127.0.0.2", 443)) == "sandgate: protocol_not_allowed"
    connect_record, denied = gw.records()
    assert (connect_record["decision"], connect_record["rule_id"]) == ("allow", "t1/allow/api")
    assert (denied["decision"], denied["reason"]) == ("deny", "protocol_not_allowed")
