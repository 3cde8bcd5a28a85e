"""MCP and JSON-RPC request bodies decided on the whole pipeline in process: an allowed call
goes on, a refused one is answered as a JSON-RPC error for its id in an HTTP 200 (never a
403), and each exchange has one record carrying the call's facts and no argument values."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
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

from sandgate.policy.protocols.json_strict import JsonValue
from sandgate.proxy.addons.protocol_bodies import MAX_BODY, arguments_digest

PORT = 8080
HOSTS = {"mcp.test": ["127.0.0.2"], "rpc.test": ["127.0.0.3"]}
MCP = f"http://mcp.test:{PORT}/mcp"
RPC = f"http://rpc.test:{PORT}/rpc"
SECRET_ARGUMENT = "octo/private-repo-name"


def tenant() -> str:
    rules = [
        {
            "id": "mcp",
            "hosts": ["mcp.test"],
            "ports": [PORT],
            "mcp": {
                "tools": {
                    "allow": ["search_*", "create_issue"],
                    "ask": ["merge_*"],
                    "deny": ["delete_*"],
                    "arguments": {"create_issue": [{"path": "repo", "one_of": ["octo/app"]}]},
                }
            },
        },
        {"id": "rpc", "hosts": ["rpc.test"], "ports": [PORT], "jsonrpc": {"methods": {"allow": ["eth_*"]}}},
    ]
    return tenant_yaml("t1", rules)


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Pipeline]:
    with whole_pipeline(tmp_path, {"t1.yaml": tenant()}, HOSTS) as running:
        yield running


def call(tool: str, arguments: dict[str, Any], rpc_id: int | str = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


async def send(
    gw: Pipeline,
    url: str,
    body: bytes | object = b"",
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> http.HTTPFlow:
    """One proxy request through the request hooks, then (when not answered) an upstream 200."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(
        client,
        url,
        method=method,
        sandbox="sb1",
        token=TOKEN,
        content=content,
        headers={"Content-Type": "application/json", **(headers or {})},
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


def answer(flow: http.HTTPFlow) -> Any:
    assert flow.response is not None and not flow.metadata.get("forwarded"), "refused by the gateway"
    assert flow.response.status_code == 200
    assert flow.response.headers["content-type"] == "application/json"
    return json.loads(flow.response.content or b"")


def one_record(gw: Pipeline) -> dict[str, Any]:
    (record,) = gw.records()
    assert SECRET_ARGUMENT not in json.dumps(record), "an argument value reached the audit trail"
    return record


async def test_an_allowed_tool_call_goes_upstream_and_its_record_names_the_tool(gw: Pipeline) -> None:
    arguments: dict[str, JsonValue] = {"query": SECRET_ARGUMENT}
    flow = await send(gw, MCP, call("search_issues", arguments, 7))
    assert flow.metadata.get("forwarded")
    record = one_record(gw)
    assert (record["decision"], record["reason"], record["rule_id"]) == ("allow", "allowed", "t1/allow/mcp")
    (message,) = record["mcp"]["messages"]
    assert message["tool"] == "search_issues" and message["id"] == 7
    assert message["arguments_sha256"] == arguments_digest(arguments)
    assert (message["verdict"], message["rule"]) == ("allow", "mcp.tools.allow[0]")


async def test_a_denied_tool_is_a_json_rpc_error_for_its_id_not_a_403(gw: Pipeline) -> None:
    flow = await send(gw, MCP, call("delete_repo", {"repo": SECRET_ARGUMENT}, "call-9"))
    error = answer(flow)
    assert error["id"] == "call-9"
    assert error["error"]["code"] == -32001
    assert error["error"]["data"]["reason"] == "tool_denied"
    assert error["error"]["data"]["rule"] == "mcp.tools.deny[0]"
    assert flow.response is not None and flow.response.headers["X-Sandgate-Reason"] == "tool_denied"
    record = one_record(gw)
    assert (record["decision"], record["reason"], record["status"]) == ("deny", "tool_denied", 200)
    assert record["mcp"]["messages"][0]["tool"] == "delete_repo"


async def test_a_tool_no_rule_allows_is_refused(gw: Pipeline) -> None:
    error = answer(await send(gw, MCP, call("push_code", {})))
    assert error["error"]["data"]["reason"] == "tool_not_allowed"
    assert one_record(gw)["reason"] == "tool_not_allowed"


async def test_an_argument_outside_its_predicate_is_refused_without_echoing_it(gw: Pipeline) -> None:
    error = answer(await send(gw, MCP, call("create_issue", {"repo": SECRET_ARGUMENT, "title": "x"})))
    assert error["error"]["data"]["reason"] == "argument_not_allowed"
    assert error["error"]["data"]["rule"] == "mcp.tools.arguments[create_issue][0]"
    assert SECRET_ARGUMENT not in json.dumps(error)
    assert one_record(gw)["reason"] == "argument_not_allowed"


async def test_an_argument_inside_its_predicate_passes(gw: Pipeline) -> None:
    flow = await send(gw, MCP, call("create_issue", {"repo": "octo/app"}))
    assert flow.metadata.get("forwarded")
    assert one_record(gw)["decision"] == "allow"


async def test_a_batch_with_one_denied_call_is_refused_whole_each_id_answered(gw: Pipeline) -> None:
    batch = [call("search_issues", {}, 1), call("delete_repo", {}, 2), {"jsonrpc": "2.0", "method": "ping"}]
    errors = answer(await send(gw, MCP, batch))
    assert [(e["id"], e["error"]["data"]["reason"]) for e in errors] == [
        (1, "batch_refused"),
        (2, "tool_denied"),
    ]
    record = one_record(gw)
    assert (record["reason"], record["mcp"]["batch"]) == ("tool_denied", 3)
    assert [m.get("tool") for m in record["mcp"]["messages"]] == ["search_issues", "delete_repo", None]


async def test_an_ask_tool_is_refused_approval_required_for_now(gw: Pipeline) -> None:
    error = answer(await send(gw, MCP, call("merge_pull", {})))
    assert error["error"]["data"]["reason"] == "approval_required"
    assert one_record(gw)["reason"] == "approval_required"


async def test_a_duplicate_key_is_a_parse_error_never_forwarded(gw: Pipeline) -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_x","name":"delete_repo"}}'
    error = answer(await send(gw, MCP, body))
    assert error["id"] is None and error["error"]["code"] == -32700
    record = one_record(gw)
    assert (record["reason"], record["mcp"]["problem"]) == ("invalid_request", "duplicate_key")


async def test_a_gzip_body_is_decided_decoded(gw: Pipeline) -> None:
    body = gzip.compress(json.dumps(call("delete_repo", {}, 3)).encode())
    error = answer(await send(gw, MCP, body, headers={"Content-Encoding": "gzip"}))
    assert (error["id"], error["error"]["data"]["reason"]) == (3, "tool_denied")
    assert one_record(gw)["reason"] == "tool_denied"


async def test_a_gzip_body_allowed_goes_on_as_sent(gw: Pipeline) -> None:
    body = gzip.compress(json.dumps(call("search_issues", {})).encode())
    flow = await send(gw, MCP, body, headers={"Content-Encoding": "gzip"})
    assert flow.metadata.get("forwarded") and flow.request.raw_content == body
    assert one_record(gw)["mcp"]["messages"][0]["tool"] == "search_issues"


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b"not json at all", {"Content-Type": "text/plain"}),
        (b"", {}),
        (b"\x1f\x8b garbage", {"Content-Encoding": "gzip"}),
        (json.dumps(call("search_issues", {})).encode(), {"Content-Encoding": "compress"}),
        (gzip.compress(b"[" * (MAX_BODY + 10)), {"Content-Encoding": "gzip"}),
    ],
    ids=[
        "a body that is not JSON (text/plain)",
        "a POST with no body",
        "a body that is not valid gzip",
        "an encoding the gateway cannot decode",
        "a gzip body that inflates past the bound",
    ],
)
async def test_an_unreadable_body_is_invalid_request(
    gw: Pipeline, body: bytes, headers: dict[str, str]
) -> None:
    flow = await send(gw, MCP, body, headers=headers)
    error = answer(flow)
    assert error["id"] is None and error["error"]["data"]["reason"] == "invalid_request"
    assert one_record(gw)["reason"] == "invalid_request"


async def test_a_declared_body_over_the_bound_is_refused_at_its_head(gw: Pipeline) -> None:
    flow = await send(gw, MCP, b"x", headers={"Content-Length": str(MAX_BODY + 1)})
    assert answer(flow)["error"]["data"]["reason"] == "invalid_request"
    assert one_record(gw)["mcp"]["problem"] == "too_large"


async def test_json_rpc_in_a_get_query_is_invalid_request(gw: Pipeline) -> None:
    flow = await send(gw, MCP + "?method=tools%2Fcall&params=%7B%7D", method="GET")
    assert answer(flow)["error"]["data"]["reason"] == "invalid_request"
    assert one_record(gw)["reason"] == "invalid_request"


async def test_a_get_without_a_body_opens_the_event_stream(gw: Pipeline) -> None:
    flow = await send(gw, MCP, method="GET", headers={"Accept": "text/event-stream"})
    assert flow.metadata.get("forwarded")
    assert one_record(gw)["decision"] == "allow"


async def test_a_notification_alone_refused_is_answered_202(gw: Pipeline) -> None:
    flow = await send(gw, MCP, {"jsonrpc": "2.0", "method": "notifications/unknown"})
    assert flow.response is not None and flow.response.status_code == 202
    assert not flow.metadata.get("forwarded")
    assert one_record(gw)["reason"] == "rpc_method_not_allowed"


async def test_a_json_rpc_rule_decides_methods(gw: Pipeline) -> None:
    error = answer(await send(gw, RPC, {"jsonrpc": "2.0", "id": 5, "method": "admin_addPeer", "params": []}))
    assert (error["id"], error["error"]["data"]["reason"]) == (5, "rpc_method_not_allowed")
    record = one_record(gw)
    assert record["jsonrpc"]["messages"][0]["method"] == "admin_addPeer"


async def test_a_json_rpc_method_allowed_goes_on(gw: Pipeline) -> None:
    flow = await send(gw, RPC, {"jsonrpc": "2.0", "id": 5, "method": "eth_call", "params": []})
    assert flow.metadata.get("forwarded")
    assert one_record(gw)["jsonrpc"]["verdict"] == "allow"


def test_a_protocol_rule_needs_inspection() -> None:
    from sandgate.policy.model.tenant import Rule

    assert Rule.model_validate({"hosts": ["a.test"], "mcp": {}}).needs_inspection
    assert yaml.safe_load(tenant())["allow"][0]["mcp"]


async def streamed(gw: Pipeline, body: bytes) -> tuple[http.HTTPFlow, bytes, Exception | None]:
    """A chunked request (no Content-Length): its head through the hooks, then its body through
    the stream mitmproxy would call chunk by chunk and with b"" at its end."""
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(
        client, MCP, method="POST", sandbox="sb1", token=TOKEN, headers={"Transfer-Encoding": "chunked"}
    )
    del flow.request.headers["content-length"]
    await gw.hook(HttpRequestHeadersHook(flow))
    stream = flow.request.stream
    assert callable(stream)
    sent, raised = b"", None
    try:
        for chunk in (body[:10], body[10:], b""):
            out = stream(chunk)
            sent += out if isinstance(out, bytes) else b"".join(out)
    except Exception as e:
        raised = e
    return flow, sent, raised


async def test_a_chunked_body_is_held_until_it_ends_then_sent_whole(gw: Pipeline) -> None:
    body = json.dumps(call("search_issues", {})).encode()
    flow, sent, raised = await streamed(gw, body)
    assert (sent, raised, flow.response) == (body, None, None)


async def test_a_chunked_body_with_a_denied_call_sends_nothing_and_is_answered(gw: Pipeline) -> None:
    flow, sent, raised = await streamed(gw, json.dumps(call("delete_repo", {}, 4)).encode())
    assert sent == b"" and raised is not None
    assert (answer(flow)["id"], answer(flow)["error"]["data"]["reason"]) == (4, "tool_denied")
    assert gw.records()[0]["reason"] == "tool_denied"
