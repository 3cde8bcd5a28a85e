"""End to end: the tenant's Rego decides MCP tool calls by their arguments (phase "message").

A real MCP client (the official SDK) talks to a real MCP server (the SDK's MCPServer over
streamable HTTP, served by uvicorn) through a real `sandgate run` whose tenant allows
`create_issue` in its `mcp:` rule and uses the shipped rules/rego/examples/mcp_arguments.rego:
an issue in a listed repository is created; one elsewhere is a JSON-RPC error naming the
reason and the policy's message, never reaches the server, and the session goes on. A body of
unknown length is refused at its head (the policy could not be asked before it streamed)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
import yaml
from conftest import REPO, TOKEN_REF, UPSTREAM_IP, GatewayFactory, RunningGateway
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from support.ports import free_port

pytestmark = pytest.mark.slow

SECRET_ARGUMENT = "evil/private-repo-name"
MESSAGE = "tool create_issue may act only on this tenant's repositories"
UNKNOWN_LENGTH = "a body of unknown length cannot be decided by the tenant's Rego; send Content-Length"
MODULE = """package sandgate.tenants.t1

import rego.v1

import data.sandgate.examples.mcp_arguments

deny contains d if some d in mcp_arguments.deny
"""


class Issues:
    """What the MCP server was asked to create."""

    def __init__(self) -> None:
        self.created: list[str] = []


def mcp_app(issues: Issues) -> Any:
    server = MCPServer("sandgate-rego-test")

    @server.tool()
    def create_issue(repo: str, title: str) -> str:
        """Create an issue."""
        issues.created.append(repo)
        return f"created in {repo}"

    @server.tool()
    def search_issues(query: str) -> str:
        """Search issues."""
        return f"found: {len(query)} characters"

    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return server.streamable_http_app(transport_security=security, host=UPSTREAM_IP)


@pytest.fixture(scope="module")
def issues() -> Issues:
    return Issues()


@pytest.fixture(scope="module")
def mcp_server(issues: Issues) -> Iterator[int]:
    """The MCP server on UPSTREAM_IP, its port."""
    port = free_port(UPSTREAM_IP)
    server = uvicorn.Server(uvicorn.Config(mcp_app(issues), host=UPSTREAM_IP, port=port, log_level="warning"))
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
    tenant = {
        "tenant": "t1",
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
        "allow": [
            {
                "id": "mcp",
                "hosts": ["api.test"],
                "ports": [mcp_server],
                "paths": ["/mcp"],
                "mcp": {"tools": {"allow": ["search_*", "create_issue"]}},
            }
        ],
        "rego": ["t1.rego", "../rego/examples/mcp_arguments.rego"],
        "data": {"mcp_repositories": {"tools": ["create_issue"], "repositories": ["octo/app"]}},
    }

    def prepare(root: Path) -> None:
        (root / "rules" / "tenants" / "t1.rego").write_text(MODULE)
        shutil.copytree(REPO / "rules" / "rego", root / "rules" / "rego")

    return start_module_gateway({"t1.yaml": yaml.safe_dump(tenant, sort_keys=False)}, prepare=prepare)


def calls(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if any(m.get("tool") for m in r.get("mcp", {}).get("messages", []))]


async def test_rego_refuses_a_call_by_its_arguments_and_the_session_lives_on(
    gateway: RunningGateway, mcp_server: int, issues: Issues
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
            created = await session.call_tool("create_issue", {"repo": "octo/app", "title": "a"})
            assert not created.is_error and "created in octo/app" in json.dumps(created.model_dump())

            with pytest.raises(MCPError) as refused:
                await session.call_tool("create_issue", {"repo": SECRET_ARGUMENT, "title": "b"})
            assert "policy_denied" in refused.value.message
            assert refused.value.data["reason"] == "policy_denied"
            assert refused.value.data["rule"] == "data.sandgate.decision"
            assert refused.value.data["detail"] == MESSAGE

            again = await session.call_tool("search_issues", {"query": "x"})
            assert not again.is_error
    assert issues.created == ["octo/app"], "the refused call reached the server"

    records = gateway.records_until(lambda found: len(calls(found)) >= 3)
    # A record is written when its exchange ends: an allowed call's (its answer streamed) may
    # come after the refusal of the call made next, so the records are compared as a set.
    decided = [
        (r["decision"], r["reason"], r["mcp"]["messages"][0]["tool"], r["rego"]) for r in calls(records)
    ]
    assert sorted(decided, key=repr) == sorted(
        [
            ("allow", "allowed", "create_issue", {"phase": "message", "verdict": "allow", "evaluated": 1}),
            (
                "deny",
                "policy_denied",
                "create_issue",
                {
                    "phase": "message",
                    "verdict": "deny",
                    "evaluated": 1,
                    "reason": "policy_denied",
                    "rule": "data.sandgate.decision",
                },
            ),
            ("allow", "allowed", "search_issues", {"phase": "message", "verdict": "allow", "evaluated": 1}),
        ],
        key=repr,
    )
    assert SECRET_ARGUMENT not in json.dumps(records), "an argument value reached the audit trail"
    assert MESSAGE not in json.dumps(records), "the policy's message reached the audit trail"


async def test_a_chunked_body_is_refused_before_any_of_it_goes_upstream(
    gateway: RunningGateway, mcp_server: int, issues: Issues
) -> None:
    gateway.mark()
    before = list(issues.created)
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 9,
            "method": "tools/call",
            "params": {"name": "create_issue", "arguments": {"repo": "octo/app", "title": "c"}},
        }
    ).encode()

    async def chunks() -> Any:
        for i in range(0, len(body), 16):
            yield body[i : i + 16]

    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(proxy=gateway.proxy(), timeout=10) as client:
        response = await client.post(f"http://api.test:{mcp_server}/mcp", content=chunks(), headers=headers)
    assert (response.status_code, response.headers["X-Sandgate-Reason"]) == (200, "invalid_request")
    # Refused at its head, before any of it was read: answered for id null.
    answer = response.json()
    error = answer["error"]
    assert (answer["id"], error["code"], error["data"]["reason"]) == (None, -32600, "invalid_request")
    assert error["data"]["detail"] == UNKNOWN_LENGTH
    (record,) = gateway.records(1)
    assert (record["decision"], record["reason"], record["detail"]) == (
        "deny",
        "invalid_request",
        UNKNOWN_LENGTH,
    )
    assert issues.created == before, "a body Rego could not decide reached the server"
    assert "Traceback" not in gateway.log()
