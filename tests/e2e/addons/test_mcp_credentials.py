"""End to end: credentials in MCP tool arguments. A real MCP client (the official SDK) holds
only a placeholder; through a real `sandgate run` it calls a real MCP server's tool (the SDK's
MCPServer over streamable HTTP) with the placeholder in the arguments. The tool gets the real
value; the client's result shows the placeholder; the record names the credential and the
tool. The same placeholder sent to another tool is refused, recorded, and never reaches it.
A tool result streamed as server-sent events in tiny chunks, the secret cut at every offset,
arrives whole with the secret scrubbed."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
import yaml
from conftest import TOKEN_REF, UPSTREAM_IP, GatewayFactory, RunningGateway
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from support.ports import free_port

pytestmark = pytest.mark.slow

# A quote, a slash and a non-ASCII letter: JSON escapes each on the way in and on the way back.
SECRET = 'ghp_REAL/"mcp"-é-0123456789abcdef'
SEEN: list[tuple[str, str]] = []


def mcp_app() -> Any:
    server = MCPServer("sandgate-credentials-test")

    @server.tool()
    def create_issue(title: str, token: str) -> str:
        """Create an issue with a token (the credential is bound to this tool)."""
        SEEN.append(("create_issue", token))
        return f"created {title!r} with token {token}"

    @server.tool()
    def delete_repo(repo: str, token: str) -> str:
        """Delete a repository (the credential is not bound to this tool)."""
        SEEN.append(("delete_repo", token))
        return f"deleted {repo} with token {token}"

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


class ChunkedToolServer:
    """An MCP endpoint that answers every tools/call with its result as server-sent events,
    the `token` argument it got echoed in it, written `size` bytes at a time (TCP_NODELAY,
    one HTTP chunk each) after a first chunk of `offset` bytes; it records the tokens it got.
    Its connections are kept alive."""

    def __init__(self) -> None:
        self._sock = socket.create_server((UPSTREAM_IP, 0))
        self.port: int = self._sock.getsockname()[1]
        self.size, self.offset = 1, 0
        self.tokens: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self._sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        # Kept alive, as a real server: a server that closes after a response must say so
        # (`Connection: close`), else the gateway may already have sent the next request on it.
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn, contextlib.suppress(OSError):
            buf = b""
            while True:
                request = _read_request(conn, buf)
                if request is None:
                    return
                body, buf = request
                self._stream(conn, json.loads(body)["params"]["arguments"]["token"])

    def _stream(self, conn: socket.socket, token: str) -> None:
        self.tokens.append(token)
        stream = sse_answer(token)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        pieces = [stream[: self.offset]] + [
            stream[i : i + self.size] for i in range(self.offset, len(stream), self.size)
        ]
        for piece in pieces:
            if piece:
                conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        conn.sendall(b"0\r\n\r\n")


def _read_request(conn: socket.socket, buf: bytes) -> tuple[bytes, bytes] | None:
    """The next request's body (framed by Content-Length) and what follows it; None: closed."""
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            return None
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        data = conn.recv(65536)
        if not data:
            return None
        rest += data
    return rest[:length], rest[length:]


def sse_answer(token: str) -> bytes:
    """A progress note, the result echoing `token` raw in its text, and again as JSON text."""
    note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
    text = f"token {token} / " + json.dumps({"token": token})
    result = {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": text}]}}
    return b"".join(
        b"event: message\r\ndata: " + json.dumps(m).encode() + b"\r\n\r\n" for m in (note, result)
    )


@pytest.fixture(scope="module")
def chunked() -> Iterator[ChunkedToolServer]:
    server = ChunkedToolServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def gateway(
    start_module_gateway: GatewayFactory, mcp_server: int, chunked: ChunkedToolServer
) -> RunningGateway:
    ports = [mcp_server, chunked.port]
    rules = [
        {
            "id": "mcp",
            "hosts": ["api.test"],
            "ports": ports,
            "paths": ["/mcp"],
            "mcp": {"tools": {"allow": ["*"]}},
        }
    ]
    creds = [
        {
            "name": "gh",
            "secret": "env:SANDGATE_TEST_GH",
            "hosts": ["api.test"],
            "ports": ports,
            "plaintext": True,
            "env": "GH_TOKEN",
            "tools": ["create_issue"],
            "inject": {"body": True},
        }
    ]
    doc = {
        "tenant": "t1",
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
        "allow": rules,
        "credentials": creds,
    }
    return start_module_gateway(
        {"t1.yaml": yaml.safe_dump(doc, sort_keys=False)}, env={"SANDGATE_TEST_GH": SECRET}
    )


@pytest.fixture(scope="module")
def placeholder(gateway: RunningGateway) -> str:
    return gateway.placeholders("sb1")["GH_TOKEN"]


def assert_no_secret(*texts: str) -> None:
    escaped = json.dumps(SECRET)[1:-1]
    for text in texts:
        assert SECRET not in text and escaped not in text, "the real value reached the guest or the trail"


async def test_the_bound_tool_gets_the_real_value_and_the_client_sees_the_placeholder(
    gateway: RunningGateway, mcp_server: int, placeholder: str
) -> None:
    gateway.mark()
    SEEN.clear()
    url = f"http://api.test:{mcp_server}/mcp"
    with anyio.fail_after(30):
        async with (
            httpx2.AsyncClient(proxy=gateway.proxy(), timeout=10) as http_client,
            streamable_http_client(url, http_client=http_client, terminate_on_close=False) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            result = await session.call_tool("create_issue", {"title": "bug", "token": placeholder})
    assert SEEN == [("create_issue", SECRET)], "the tool did not get the real value"
    shown = json.dumps(result.model_dump(), ensure_ascii=False)
    assert not result.is_error and f"with token {placeholder}" in shown
    assert_no_secret(shown)

    def calls(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r.get("credentials")]

    (record,) = calls(gateway.records_until(lambda found: len(calls(found)) >= 1))
    assert (record["decision"], record["credentials"], record["injectors"]) == ("allow", ["gh"], ["body"])
    assert record["broker"]["tools"] == [{"credential": "gh", "tool": "create_issue"}]
    assert_no_secret(gateway.audit_path.read_text(), gateway.log())


async def test_the_placeholder_sent_to_another_tool_is_refused_recorded_and_never_swapped(
    gateway: RunningGateway, mcp_server: int, placeholder: str
) -> None:
    gateway.mark()
    SEEN.clear()
    call = {
        "jsonrpc": "2.0",
        "id": 5,
        "method": "tools/call",
        "params": {"name": "delete_repo", "arguments": {"repo": "octo/app", "token": placeholder}},
    }
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx2.AsyncClient(proxy=gateway.proxy(), timeout=10) as client:
        response = await client.post(f"http://api.test:{mcp_server}/mcp", json=call, headers=headers)
    # A JSON-RPC error for the call's id, in an HTTP 200: the MCP session lives on.
    assert response.status_code == 200
    assert response.headers["X-Sandgate-Reason"] == "credential_host_mismatch"
    answer = response.json()
    assert (answer["id"], answer["error"]["data"]["reason"]) == (5, "credential_host_mismatch")
    assert SEEN == [], "the refused call reached the server"
    (record,) = gateway.records(1)
    assert (record["decision"], record["reason"], record["detail"]) == (
        "deny",
        "credential_host_mismatch",
        "unbound_tool",
    )
    assert record["credentials"] == ["gh"]
    assert record["broker"]["tools"] == [{"credential": "gh", "tool": "delete_repo"}]
    assert_no_secret(response.text, gateway.audit_path.read_text())


@pytest.mark.parametrize("size", [1, 3, 16], ids=lambda n: f"in {n}-byte chunks")
async def test_an_event_stream_result_cut_anywhere_arrives_whole_and_scrubbed(
    gateway: RunningGateway, chunked: ChunkedToolServer, placeholder: str, size: int
) -> None:
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "create_issue", "arguments": {"title": "t", "token": placeholder}},
    }
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    expected = sse_answer(placeholder)
    async with httpx2.AsyncClient(proxy=gateway.proxy(), timeout=10) as client:
        for offset in range(size):  # the secret cut at every offset a chunk of this size can
            chunked.size, chunked.offset = size, offset
            chunked.tokens.clear()
            response = await client.post(f"http://api.test:{chunked.port}/mcp", json=call, headers=headers)
            assert response.status_code == 200, response.text
            assert chunked.tokens == [SECRET]
            assert response.content == expected
