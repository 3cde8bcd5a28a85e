"""MCP tool calls held for a person, end to end: a real MCP client (the official SDK) calls a
real MCP server (the SDK's MCPServer over streamable HTTP) through a real `sandgate run` with
two workers. A tool an `mcp.tools.ask` glob names waits until an operator decides with
`sandgate requests` (through the lead, whichever worker holds it): approved, the client's call
completes with the tool's result; denied, it is a JSON-RPC error and the session goes on;
approved for the sandbox, the same call goes through next time without asking, and a call
with other arguments is asked about again."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
from conftest import SANDGATE, UPSTREAM_IP, GatewayFactory, RunningGateway, tenant_yaml
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from support.ports import free_port

pytestmark = pytest.mark.slow

SECRET_ARGUMENT = "octo/private-repo-name"


def mcp_app() -> Any:
    server = MCPServer("sandgate-approvals-test")

    @server.tool()
    def search_issues(query: str) -> str:
        """Search issues."""
        return f"found: {len(query)} characters"

    @server.tool()
    def merge_pull(number: int, repo: str) -> str:
        """Merge a pull request (asked for)."""
        return f"merged {number} of {len(repo)}"

    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return server.streamable_http_app(transport_security=security, host=UPSTREAM_IP)


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[int]:
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
            "mcp": {"tools": {"allow": ["search_*"], "ask": ["merge_*"]}},
        }
    ]
    # Two workers: a held call lives in whichever worker took its connection; the CLI goes
    # through the lead, which finds it and takes the decision there.
    return start_module_gateway({"t1.yaml": tenant_yaml("t1", rules)}, config={"workers": {"count": 2}})


def sandgate(gw: RunningGateway, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, *args, "--config", str(gw.root / "sandgate.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )


def held(gw: RunningGateway, timeout: float = 20.0) -> dict[str, Any]:
    """The one access request held now (waits for it)."""
    deadline = time.monotonic() + timeout
    while True:
        out = sandgate(gw, "requests", "list", "--format", "json")
        assert out.returncode == 0, out.stderr
        found = [r for r in json.loads(out.stdout)["requests"] if r["state"] == "held"]
        if found:
            assert len(found) == 1, found
            first: dict[str, Any] = found[0]
            return first
        assert time.monotonic() < deadline, "no request was held"
        time.sleep(0.2)


@asynccontextmanager
async def session(gw: RunningGateway, port: int) -> AsyncIterator[ClientSession]:
    async with (
        httpx2.AsyncClient(proxy=gw.proxy(), timeout=45) as http_client,
        streamable_http_client(
            f"http://api.test:{port}/mcp", http_client=http_client, terminate_on_close=False
        ) as (read, write),
        ClientSession(read, write) as mcp,
    ):
        await mcp.initialize()
        yield mcp


def text_of(result: Any) -> str:
    return json.dumps(result.model_dump())


async def test_an_approved_tool_call_completes_with_the_tools_result(
    gateway: RunningGateway, mcp_server: int
) -> None:
    gateway.mark()
    with anyio.fail_after(60):
        async with session(gateway, mcp_server) as mcp:
            call = asyncio.create_task(mcp.call_tool("merge_pull", {"number": 7, "repo": SECRET_ARGUMENT}))
            pending = await asyncio.to_thread(held, gateway)
            assert (pending["tool"], pending["host"], pending["path"]) == ("merge_pull", "api.test", "/mcp")
            [asked] = pending["tool_calls"]
            assert json.loads(asked["arguments_preview"]) == {"number": 7, "repo": SECRET_ARGUMENT}
            listed = await asyncio.to_thread(sandgate, gateway, "requests", "list")
            assert "tool merge_pull" in listed.stdout
            shown = await asyncio.to_thread(sandgate, gateway, "requests", "show", pending["id"])
            assert f"arguments_sha256: {asked['arguments_sha256']}" in shown.stdout
            assert not call.done(), "the call waits while it is held"
            approved = await asyncio.to_thread(sandgate, gateway, "requests", "approve", pending["id"])
            assert approved.returncode == 0, approved.stderr
            result = await call
            assert not result.is_error and "merged 7 of 22" in text_of(result)

    def ends(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r.get("approval", {}).get("id") == pending["id"]]

    records = gateway.records_until(lambda found: len(ends(found)) >= 1)
    [ask] = [r for r in records if r.get("approval_id") == pending["id"]]
    [end] = ends(records)
    assert (ask["decision"], ask["mcp"]["messages"][0]["tool"]) == ("ask", "merge_pull")
    assert (end["decision"], end["reason"], end["status"]) == ("allow", "allowed", 200)
    assert end["mcp"]["messages"][0]["arguments_sha256"] == asked["arguments_sha256"]
    assert SECRET_ARGUMENT not in json.dumps(records), "an argument value reached the audit trail"


async def test_a_denied_tool_call_is_an_mcp_error_and_the_session_lives_on(
    gateway: RunningGateway, mcp_server: int
) -> None:
    gateway.mark()
    with anyio.fail_after(60):
        async with session(gateway, mcp_server) as mcp:
            call = asyncio.create_task(mcp.call_tool("merge_pull", {"number": 8, "repo": "x"}))
            pending = await asyncio.to_thread(held, gateway)
            denied = await asyncio.to_thread(sandgate, gateway, "requests", "deny", pending["id"])
            assert denied.returncode == 0, denied.stderr
            with pytest.raises(MCPError) as refused:
                await call
            assert refused.value.data["reason"] == "approval_denied"
            again = await mcp.call_tool("search_issues", {"query": "abc"})
            assert not again.is_error and "found: 3 characters" in text_of(again)


async def test_approved_for_the_sandbox_the_same_call_goes_through_and_other_arguments_ask_again(
    gateway: RunningGateway, mcp_server: int
) -> None:
    gateway.mark()
    arguments = {"number": 9, "repo": "octo/app"}
    with anyio.fail_after(90):
        async with session(gateway, mcp_server) as mcp:
            call = asyncio.create_task(mcp.call_tool("merge_pull", arguments))
            pending = await asyncio.to_thread(held, gateway)
            approved = await asyncio.to_thread(
                sandgate,
                gateway,
                "requests",
                "approve",
                pending["id"],
                "--scope",
                "sandbox",
                "--format",
                "json",
            )
            assert approved.returncode == 0, approved.stderr
            grant = json.loads(approved.stdout)["grant"]
            assert (grant["tool"], grant["arguments_sha256"]) == (
                "merge_pull",
                pending["tool_calls"][0]["arguments_sha256"],
            )
            assert "merged 9" in text_of(await call)

            # The same call again: granted, not held.
            again = await mcp.call_tool("merge_pull", arguments)
            assert "merged 9" in text_of(again)

            # Other arguments: asked about again.
            other = asyncio.create_task(mcp.call_tool("merge_pull", {"number": 10, "repo": "octo/app"}))
            second = await asyncio.to_thread(held, gateway)
            assert second["id"] != pending["id"]
            await asyncio.to_thread(sandgate, gateway, "requests", "deny", second["id"])
            with pytest.raises(MCPError):
                await other
            grants = await asyncio.to_thread(sandgate, gateway, "requests", "grants")
            assert "tool merge_pull" in grants.stdout
            revoked = await asyncio.to_thread(sandgate, gateway, "requests", "revoke", pending["id"])
            assert revoked.returncode == 0, revoked.stderr

    def granted(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            r
            for r in records
            if r.get("approval", {}).get("id") == pending["id"] and "waited_seconds" not in r["approval"]
        ]

    [used] = granted(gateway.records_until(lambda found: len(granted(found)) >= 1))
    assert used["mcp"]["messages"][0]["rule"] == f"t1/grant/{pending['id']}"
