"""End to end: MCP's older HTTP+SSE transport through a real `sandgate run`. The client (the
official SDK's `sse_client`) opens a GET event stream, learns the URL to POST to from its
`endpoint` event, POSTs each call there (answered 202) and reads the answers on the stream.
The POSTs are decided like streamable HTTP's; the answers on the GET stream carry no request
of their own, so list answers there are filtered by their shape: the agent sees only the tools
it may call. A denied call is refused on its POST (HTTP 200, a JSON-RPC error), which this
transport's clients do not read: the call goes unanswered, and the session lives on."""

from __future__ import annotations

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
from mcp.client.sse import sse_client
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from support.ports import free_port

pytestmark = pytest.mark.slow


def sse_app() -> Any:
    server = MCPServer("sandgate-sse-test")

    @server.tool()
    def search_issues(query: str) -> str:
        """Search issues."""
        return f"found: {len(query)} characters"

    @server.tool()
    def delete_repo(repo: str) -> str:
        """Delete a repository."""
        return f"deleted {repo}"

    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return server.sse_app(transport_security=security, host=UPSTREAM_IP)


@pytest.fixture(scope="module")
def sse_server() -> Iterator[int]:
    port = free_port(UPSTREAM_IP)
    server = uvicorn.Server(uvicorn.Config(sse_app(), host=UPSTREAM_IP, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError("the MCP SSE server did not start")
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def gateway(start_module_gateway: GatewayFactory, sse_server: int) -> RunningGateway:
    rules = [
        {
            "id": "mcp-sse",
            "hosts": ["api.test"],
            "ports": [sse_server],
            "mcp": {"tools": {"allow": ["search_*"], "deny": ["delete_*"]}},
        }
    ]
    return start_module_gateway({"t1.yaml": tenant_yaml("t1", rules)})


def _through(gateway: RunningGateway) -> Any:
    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(proxy=gateway.proxy(), headers=headers, timeout=timeout, auth=auth)

    return factory


async def test_list_answers_on_the_event_stream_are_filtered(
    gateway: RunningGateway, sse_server: int
) -> None:
    gateway.mark()
    url = f"http://api.test:{sse_server}/sse"
    with anyio.fail_after(30):
        async with (
            sse_client(url.replace("api.test", UPSTREAM_IP)) as (r, w),
            ClientSession(r, w) as direct,
        ):
            await direct.initialize()
            everything = {tool.name for tool in (await direct.list_tools()).tools}
        async with (
            sse_client(url, httpx_client_factory=_through(gateway)) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = await session.list_tools()
    assert everything == {"search_issues", "delete_repo"}
    assert [tool.name for tool in listed.tools] == ["search_issues"]

    def streams(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r.get("mcp", {}).get("removed")]

    (record,) = streams(gateway.records_until(lambda found: len(streams(found)) >= 1))
    assert record["method"] == "GET"
    assert record["mcp"]["removed"] == {"tools/list": {"count": 1, "names": ["delete_repo"]}}


async def test_a_denied_call_is_an_error_and_the_session_lives_on(
    gateway: RunningGateway, sse_server: int
) -> None:
    gateway.mark()
    url = f"http://api.test:{sse_server}/sse"
    with anyio.fail_after(30):
        async with (
            sse_client(url, httpx_client_factory=_through(gateway)) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            allowed = await session.call_tool("search_issues", {"query": "abc"})
            assert not allowed.is_error and "found: 3 characters" in str(allowed.model_dump())
            # This transport's clients read answers only on the event stream and ignore the
            # POST's own answer, where the gateway's refusal goes (an HTTP 200 with the JSON-RPC
            # error; an error status would end the SDK's writer and the session with it). The
            # refused call gets no answer; the session goes on.
            with pytest.raises(TimeoutError), anyio.fail_after(2):
                await session.call_tool("delete_repo", {"repo": "octo/app"})
            again = await session.call_tool("search_issues", {"query": "x"})
            assert not again.is_error

    def calls(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if any(m.get("tool") for m in r.get("mcp", {}).get("messages", []))]

    records = gateway.records_until(lambda found: len(calls(found)) >= 3)
    assert [(r["decision"], r["mcp"]["messages"][0]["tool"]) for r in calls(records)] == [
        ("allow", "search_issues"),
        ("deny", "delete_repo"),
        ("allow", "search_issues"),
    ]
