"""End to end: a real MCP client (the official SDK) talks to a real MCP server (the SDK's
MCPServer over streamable HTTP, served by uvicorn) through a real `sandgate run` as its
explicit proxy. An allowed tool is called; a denied one is a JSON-RPC error the SDK raises as
MCPError with the gateway's reason, and the same session then calls an allowed tool again.
`tools/list` shows the agent only the tools it may call (or ask for)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
from conftest import UPSTREAM_IP, GatewayFactory, RunningGateway, tenant_yaml
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from support.ports import free_port

pytestmark = pytest.mark.slow

SECRET_ARGUMENT = "octo/private-repo-name"


def mcp_app() -> Any:
    server = MCPServer("sandgate-test")

    @server.tool()
    def search_issues(query: str) -> str:
        """Search issues."""
        return f"found: {len(query)} characters"

    @server.tool()
    def delete_repo(repo: str) -> str:
        """Delete a repository."""
        return f"deleted {repo}"

    @server.tool()
    def merge_pull(number: int) -> str:
        """Merge a pull request (asked for)."""
        return f"merged {number}"

    @server.tool()
    def push_code(branch: str) -> str:
        """Push code (no rule allows it)."""
        return f"pushed {branch}"

    # The Host the server sees names the gateway's destination (api.test), not loopback.
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return server.streamable_http_app(transport_security=security, host=UPSTREAM_IP)


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[int]:
    """The MCP server on UPSTREAM_IP, its port."""
    port = free_port(UPSTREAM_IP)
    server = uvicorn.Server(uvicorn.Config(mcp_app(), host=UPSTREAM_IP, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError("the MCP server did not start")
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def gateway(start_module_gateway: GatewayFactory, mcp_server: int) -> RunningGateway:
    rules = [
        {
            "id": "mcp",
            "hosts": ["api.test"],
            "ports": [mcp_server],
            "paths": ["/mcp"],
            "mcp": {"tools": {"allow": ["search_*"], "ask": ["merge_*"], "deny": ["delete_*"]}},
        }
    ]
    return start_module_gateway({"t1.yaml": tenant_yaml("t1", rules)})


async def test_a_denied_tool_is_an_mcp_error_and_the_session_lives_on(
    gateway: RunningGateway, mcp_server: int
) -> None:
    gateway.mark()
    url = f"http://api.test:{mcp_server}/mcp"
    with anyio.fail_after(30):
        async with (
            httpx2.AsyncClient(proxy=gateway.proxy(), timeout=10) as http_client,
            streamable_http_client(url, http_client=http_client, terminate_on_close=False) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            first = await session.call_tool("search_issues", {"query": SECRET_ARGUMENT})
            assert not first.is_error and "found: 22 characters" in json.dumps(first.model_dump())

            with pytest.raises(MCPError) as refused:
                await session.call_tool("delete_repo", {"repo": SECRET_ARGUMENT})
            assert "tool_denied" in refused.value.message
            assert refused.value.data["reason"] == "tool_denied"
            assert refused.value.data["rule"] == "mcp.tools.deny[0]"

            again = await session.call_tool("search_issues", {"query": "x"})
            assert not again.is_error

    def calls(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if any(m.get("tool") for m in r.get("mcp", {}).get("messages", []))]

    records = gateway.records_until(lambda found: len(calls(found)) >= 3)
    # A record is written when its exchange ends: an allowed call's (its answer streamed) may
    # come after the refusal of the call made next, so the records are compared as a set.
    tools = [(r["decision"], r["reason"], r["mcp"]["messages"][0]["tool"]) for r in calls(records)]
    assert sorted(tools) == [
        ("allow", "allowed", "search_issues"),
        ("allow", "allowed", "search_issues"),
        ("deny", "tool_denied", "delete_repo"),
    ]
    assert all(len(r["mcp"]["messages"][0]["arguments_sha256"]) == 64 for r in calls(records))
    assert SECRET_ARGUMENT not in json.dumps(records), "an argument value reached the audit trail"


@pytest.mark.parametrize(
    ("tool", "refused"), [("delete_repo", True), ("search_issues", False)], ids=["denied", "allowed"]
)
async def test_a_chunked_body_is_decided_before_any_of_it_goes_upstream(
    gateway: RunningGateway, mcp_server: int, tool: str, refused: bool
) -> None:
    gateway.mark()
    body = json.dumps(
        {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": tool, "arguments": {}}}
    ).encode()

    async def chunks() -> Any:
        for i in range(0, len(body), 16):
            yield body[i : i + 16]

    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(proxy=gateway.proxy(), timeout=10) as client:
        response = await client.post(f"http://api.test:{mcp_server}/mcp", content=chunks(), headers=headers)
    assert ("X-Sandgate-Reason" in response.headers) is refused
    if refused:
        assert response.status_code == 200
        assert response.json()["error"]["data"]["reason"] == "tool_denied"
    (record,) = gateway.records(1)
    assert record["decision"] == ("deny" if refused else "allow")
    assert record["mcp"]["messages"][0]["tool"] == tool
    # A body refused as it streamed is cut by the HTTP seam: a clean close, no crash logged.
    assert "Traceback" not in gateway.log()


async def test_the_agent_lists_only_the_tools_it_may_call_or_ask_for(
    gateway: RunningGateway, mcp_server: int
) -> None:
    gateway.mark()
    url = f"http://api.test:{mcp_server}/mcp"
    with anyio.fail_after(30):
        async with (
            httpx2.AsyncClient(timeout=10) as direct_client,
            streamable_http_client(url.replace("api.test", UPSTREAM_IP), http_client=direct_client) as (r, w),
            ClientSession(r, w) as direct,
        ):
            await direct.initialize()
            everything = {tool.name for tool in (await direct.list_tools()).tools}
        async with (
            httpx2.AsyncClient(proxy=gateway.proxy(), timeout=10) as http_client,
            streamable_http_client(url, http_client=http_client, terminate_on_close=False) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = await session.list_tools()
    assert everything == {"search_issues", "delete_repo", "merge_pull", "push_code"}
    assert sorted(tool.name for tool in listed.tools) == ["merge_pull", "search_issues"]

    def lists(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r.get("mcp", {}).get("removed")]

    (record,) = lists(gateway.records_until(lambda found: len(lists(found)) >= 1))
    assert record["mcp"]["removed"] == {"tools/list": {"count": 2, "names": ["delete_repo", "push_code"]}}
