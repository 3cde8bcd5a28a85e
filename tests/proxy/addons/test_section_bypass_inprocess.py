"""An MCP section is not bypassed through the whole pipeline in process: a second, broader
allow rule for the same host (listed first, so it is the one that matches) does not let a
denied tool call go upstream; the call is answered as a JSON-RPC error for its id."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TOKEN, tenant_yaml
from mitmproxy import http
from mitmproxy.proxy.layers.http._hooks import (
    HttpRequestHeadersHook,
    HttpRequestHook,
    HttpResponseHeadersHook,
    HttpResponseHook,
)
from mitmproxy.test import tflow
from support.inprocess import proxy_flow
from support.whole_pipeline import Pipeline, whole_pipeline

PORT = 8080
HOSTS = {"mcp.corp.test": ["127.0.0.2"]}
URL = f"http://mcp.corp.test:{PORT}/mcp"


def tenant() -> str:
    rules: list[dict[str, Any]] = [
        # Broader, first, and without a section: the rule the matcher picks for every request.
        {"id": "everything", "hosts": ["mcp.corp.test", "*.corp.test"], "ports": [PORT]},
        {
            "id": "mcp",
            "hosts": ["mcp.corp.test"],
            "ports": [PORT],
            "paths": ["/mcp"],
            "mcp": {"tools": {"allow": ["search_*"], "deny": ["delete_*"]}},
        },
    ]
    return tenant_yaml("t1", rules)


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Pipeline]:
    with whole_pipeline(tmp_path, {"t1.yaml": tenant()}, HOSTS) as running:
        yield running


def call(tool: str, rpc_id: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": {"name": tool, "arguments": {}}}


async def send(gw: Pipeline, url: str, body: object) -> http.HTTPFlow:
    """One proxy request through the request hooks, then (when not answered) an upstream 200."""
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(
        client,
        url,
        method="POST",
        sandbox="sb1",
        token=TOKEN,
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    await gw.hook(HttpRequestHeadersHook(flow))
    if flow.response is None:
        await gw.hook(HttpRequestHook(flow))
    if flow.response is None:
        flow.response = http.Response.make(200, b'{"jsonrpc":"2.0","id":1,"result":{}}')
        await gw.hook(HttpResponseHeadersHook(flow))
        flow.metadata["forwarded"] = True
    await gw.hook(HttpResponseHook(flow))
    return flow


@pytest.mark.parametrize("path", ["/mcp", "/MCP", "/other"], ids=["its path", "another case", "another path"])
async def test_a_denied_tool_is_refused_though_a_broader_rule_allows_the_host(
    gw: Pipeline, path: str
) -> None:
    flow = await send(gw, f"http://mcp.corp.test:{PORT}{path}", call("delete_repo", 4))
    assert not flow.metadata.get("forwarded"), "the denied call went upstream"
    assert flow.response is not None and flow.response.status_code == 200
    error = json.loads(flow.response.content or b"")
    assert error["id"] == 4 and error["error"]["data"]["reason"] == "tool_denied"
    (record,) = gw.records()
    assert (record["decision"], record["reason"]) == ("deny", "tool_denied")
    assert record["rule_id"] == "t1/allow/everything"


async def test_an_allowed_tool_still_goes_upstream(gw: Pipeline) -> None:
    flow = await send(gw, URL, call("search_issues", 5))
    assert flow.metadata.get("forwarded")
    (record,) = gw.records()
    assert (record["decision"], record["mcp"]["messages"][0]["tool"]) == ("allow", "search_issues")
