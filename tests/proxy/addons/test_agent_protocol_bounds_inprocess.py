"""The gateway config's `agent_protocols:` bounds reach every reader, in process: with
`max_body_bytes` lowered, an MCP body one byte over it is refused at its head (`invalid_request`,
`too_large`) and one exactly at it goes upstream, a chunked one over it is refused as it
streams; with `max_depth` lowered, a tool call whose argument nests past it is refused
(`too_deep`) and one at it goes on; with `max_batch` lowered, a batch one over it is refused;
a `tools/list` answer within the bytes is filtered, one over them cut rather than passed
unfiltered."""

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
from support.inprocess import InProcess, in_process, proxy_flow

from sandgate.proxy.addons.agent_lists import AgentListFilter
from sandgate.proxy.addons.agent_protocols import AgentProtocols, ProtocolBodyRefused
from sandgate.proxy.addons.audit_completion import AuditCompletion
from sandgate.proxy.addons.dial_guard import DialGuard
from sandgate.proxy.addons.identify import Identify
from sandgate.proxy.addons.limits import TenantLimits
from sandgate.proxy.addons.pipeline import Shared
from sandgate.proxy.addons.protocol_bodies import DEFAULT_BOUNDS, bounds_of
from sandgate.proxy.addons.request_gate import RequestGate
from sandgate.proxy.config import AgentProtocolsConfig

PORT = 8080
HOSTS = {"mcp.test": ["127.0.0.2"]}
MCP = f"http://mcp.test:{PORT}/mcp"
ADDONS = {Identify, RequestGate, DialGuard, TenantLimits, AgentProtocols, AgentListFilter, AuditCompletion}
MAX_BODY = 2048
MAX_DEPTH = 8
MAX_BATCH = 3


def tenant() -> str:
    rule = {"id": "mcp", "hosts": ["mcp.test"], "ports": [PORT], "mcp": {"tools": {"allow": ["search_*"]}}}
    return tenant_yaml("t1", [rule])


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[InProcess]:
    bounds = AgentProtocolsConfig(max_body_bytes=MAX_BODY, max_depth=MAX_DEPTH, max_batch=MAX_BATCH)
    with in_process(
        tmp_path, {"t1.yaml": tenant()}, HOSTS, ADDONS, shared=Shared(agent_protocols=bounds)
    ) as gw:
        yield gw


def call(arguments: Any, rpc_id: int = 1) -> dict[str, Any]:
    params = {"name": "search_issues", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params}


def sized(size: int) -> bytes:
    """A tools/call body of exactly `size` bytes (its padding in one argument)."""
    bare = len(json.dumps(call({"q": ""})).encode())
    body = json.dumps(call({"q": "x" * (size - bare)})).encode()
    assert len(body) == size
    return body


def nested(levels: int) -> bytes:
    """A tools/call body nested `levels` deep: the message, params, arguments, then objects."""
    argument: Any = "deep"
    for _ in range(levels - 2):  # the arguments object is the first of them
        argument = {"a": argument}
    body = json.dumps(call(argument)).encode()
    assert json.loads(body) and body.count(b"{") == levels
    return body


async def send(gw: InProcess, content: bytes) -> http.HTTPFlow:
    """One proxy POST through the request hooks, then (when not answered) the upstream's answer."""
    client = tflow.tclient_conn()
    await gw.connect(client)
    headers = {"Content-Type": "application/json"}
    flow = proxy_flow(
        client, MCP, method="POST", sandbox="sb1", token=TOKEN, content=content, headers=headers
    )
    await gw.hook(HttpRequestHeadersHook(flow))
    if flow.response is None:
        await gw.hook(HttpRequestHook(flow))
    if flow.response is None:
        flow.response = http.Response.make(200, b'{"jsonrpc":"2.0","id":1,"result":{}}')
        flow.response.headers["Content-Type"] = "application/json"
        flow.metadata["forwarded"] = True
        await gw.hook(HttpResponseHeadersHook(flow))
    await gw.hook(HttpResponseHook(flow))
    return flow


def refusal(flow: http.HTTPFlow) -> dict[str, Any]:
    """The JSON-RPC error the gateway answered with (the request never went upstream)."""
    assert flow.response is not None and not flow.metadata.get("forwarded"), "went upstream"
    assert flow.response.status_code == 200
    error: dict[str, Any] = json.loads(flow.response.content or b"")["error"]
    return error


def test_the_defaults_are_todays_fixed_bounds() -> None:
    assert bounds_of(AgentProtocolsConfig()) == DEFAULT_BOUNDS
    assert (DEFAULT_BOUNDS.max_body, DEFAULT_BOUNDS.json.max_depth, DEFAULT_BOUNDS.max_batch) == (
        1 << 20,
        64,
        64,
    )
    assert (DEFAULT_BOUNDS.graphql.max_bytes, DEFAULT_BOUNDS.graphql.max_batch) == (64 * 1024, 16)


async def test_a_body_at_max_body_bytes_goes_upstream_and_one_byte_over_is_refused_too_large(
    gw: InProcess,
) -> None:
    at = await send(gw, sized(MAX_BODY))
    over = await send(gw, sized(MAX_BODY + 1))
    assert at.metadata.get("forwarded")
    error = refusal(over)
    assert (error["code"], error["data"]["reason"]) == (-32700, "invalid_request")
    assert f"over the {MAX_BODY} a rule reads" in error["data"]["detail"]
    allowed, refused = gw.records()
    assert (allowed["decision"], allowed["reason"]) == ("allow", "allowed")
    assert (refused["decision"], refused["reason"], refused["mcp"]["problem"]) == (
        "deny",
        "invalid_request",
        "too_large",
    )


async def test_a_chunked_body_over_max_body_bytes_is_refused_as_it_streams(gw: InProcess) -> None:
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(client, MCP, method="POST", sandbox="sb1", token=TOKEN, content=b"")
    del flow.request.headers["content-length"]
    flow.request.headers["Transfer-Encoding"] = "chunked"
    await gw.hook(HttpRequestHeadersHook(flow))
    stream = flow.request.stream
    assert callable(stream)
    body = sized(MAX_BODY + 1)
    assert stream(body[:MAX_BODY]) == b""  # held back, nothing sent
    with pytest.raises(ProtocolBodyRefused):
        stream(body[MAX_BODY:])
    assert flow.response is not None
    error = json.loads(flow.response.content or b"")["error"]
    assert error["data"]["reason"] == "invalid_request"


async def test_an_argument_nested_past_max_depth_is_refused_too_deep(gw: InProcess) -> None:
    at = await send(gw, nested(MAX_DEPTH))
    past = await send(gw, nested(MAX_DEPTH + 1))
    assert at.metadata.get("forwarded")
    error = refusal(past)
    assert (error["code"], error["data"]["reason"]) == (-32700, "invalid_request")
    assert f"the limit is {MAX_DEPTH}" in error["data"]["detail"]
    refused = gw.records()[1]
    assert (refused["reason"], refused["mcp"]["problem"]) == ("invalid_request", "too_deep")


async def test_a_batch_over_max_batch_is_refused(gw: InProcess) -> None:
    at = await send(gw, json.dumps([call({}, i) for i in range(MAX_BATCH)]).encode())
    over = await send(gw, json.dumps([call({}, i) for i in range(MAX_BATCH + 1)]).encode())
    assert at.metadata.get("forwarded")
    assert refusal(over)["data"]["reason"] == "invalid_request"
    assert gw.records()[1]["mcp"]["problem"] == "batch_too_large"


@pytest.mark.parametrize(
    "over", [False, True], ids=["a list answer within the bytes is filtered", "one over them is cut"]
)
async def test_a_list_answer_is_read_within_max_body_bytes(gw: InProcess, over: bool) -> None:
    tools = [{"name": f"search_{i}", "description": "x" * 40} for i in range(40 if over else 4)]
    tools.append({"name": "delete_all"})  # not allowed: filtered out of a list it can read
    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"tools": tools}}).encode()
    assert (len(answer) > MAX_BODY) is over
    client = tflow.tclient_conn()
    await gw.connect(client)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    flow = proxy_flow(client, MCP, method="POST", sandbox="sb1", token=TOKEN, content=body)
    await gw.hook(HttpRequestHeadersHook(flow))
    await gw.hook(HttpRequestHook(flow))
    flow.response = http.Response.make(200, answer, {"Content-Type": "application/json"})
    await gw.hook(HttpResponseHeadersHook(flow))
    if over:
        # Past the bound the answer is streamed to be read whole, and cut when it cannot be.
        stream = flow.response.stream
        assert callable(stream)
        with pytest.raises(ProtocolBodyRefused):
            stream(answer)
        return
    await gw.hook(HttpResponseHook(flow))
    listed = json.loads(flow.response.content or b"")["result"]["tools"]
    assert [t["name"] for t in listed] == [f"search_{i}" for i in range(4)]
