"""A tunnel's ClientHello on the whole pipeline in process: its SNI must name the CONNECT host,
or the connection is refused (`sni_mismatch`, one record) and its upstream never dialled."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TOKEN, tenant_yaml
from mitmproxy import connection
from mitmproxy.proxy.layers.http._hooks import HttpConnectHook
from mitmproxy.test import tflow
from support.inprocess import connect_flow
from support.whole_pipeline import Pipeline, whole_pipeline

HOSTS = {"api.test": ["127.0.0.2"], "other.test": ["127.0.0.3"]}
# Passed through (no inspection): the SNI is all the gateway sees of where the TLS goes.
RULES = [
    {"id": "api", "hosts": ["api.test"], "ports": [443]},
    {"id": "other", "hosts": ["other.test"], "ports": [443]},
]


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Pipeline]:
    with whole_pipeline(tmp_path, {"t1.yaml": tenant_yaml("t1", RULES)}, HOSTS) as running:
        yield running


async def connected(gw: Pipeline) -> connection.Client:
    """A connection whose CONNECT to api.test:443 was allowed."""
    client = tflow.tclient_conn()
    await gw.connect(client)
    connect = connect_flow(client, "api.test", 443, sandbox="sb1", token=TOKEN)
    await gw.hook(HttpConnectHook(connect))
    assert connect.response is None
    return client


async def test_a_client_hello_naming_the_connect_host_is_passed_through_and_dialled(gw: Pipeline) -> None:
    client = await connected(gw)
    hello = await gw.hello(client, "API.test.")  # compared normalised: case, trailing dot
    assert hello.ignore_connection  # passed through untouched
    assert await gw.dial(client, ("127.0.0.2", 443)) is None
    connect, tls = gw.records()
    assert (connect["phase"], connect["decision"]) == ("connect", "allow")
    assert (tls["phase"], tls["decision"], tls["reason"]) == ("tls", "allow", "allowed")


@pytest.mark.parametrize(
    ("sni", "detail"),
    [
        ("other.test", "SNI does not name the CONNECT host"),
        (None, "no SNI on a passthrough tunnel"),
    ],
    ids=["an SNI naming another (allowed) host", "no SNI on a passthrough tunnel"],
)
async def test_a_client_hello_not_naming_the_connect_host_is_refused_and_never_dialled(
    gw: Pipeline, sni: str | None, detail: str
) -> None:
    client = await connected(gw)
    hello = await gw.hello(client, sni)
    assert hello.ignore_connection  # not intercepted: the refused connection is closed
    # Neither the tunnel's approved address nor the SNI's host's is dialled now.
    assert await gw.dial(client, ("127.0.0.2", 443)) == "sandgate: sni_mismatch"
    assert await gw.dial(client, ("127.0.0.3", 443)) is not None
    connect, tls = gw.records()
    assert (connect["phase"], connect["decision"]) == ("connect", "allow")
    assert (tls["phase"], tls["decision"], tls["reason"]) == ("tls", "deny", "sni_mismatch")
    assert (tls["dest"]["host"], tls["dest"]["sni"], tls["detail"]) == ("api.test", sni, detail)
