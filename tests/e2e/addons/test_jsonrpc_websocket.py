"""JSON-RPC and MCP inside WebSocket messages, decided one by one (AgentWebsocket).

End to end through a real `sandgate run` to a real WebSocket upstream on loopback (aiohttp's
server: it joins a message's fragments, records every whole message per connection and echoes
each text as `echo: <text>`), with a raw wsproto guest (tests/support/ws_peers.py: it can split
a message across frames) and aiohttp's client.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any, Self

import aiohttp
import pytest
import yaml
from aiohttp import web
from conftest import (
    OTHER_TOKEN,
    OTHER_TOKEN_REF,
    TOKEN,
    TOKEN_REF,
    UPSTREAM_IP,
    GatewayFactory,
    RunningGateway,
)
from support import TestPKI
from support.ports import free_port
from support.ws_peers import WebSocketGuest
from wsproto.events import BytesMessage, CloseConnection, TextMessage

pytestmark = pytest.mark.slow

SECRET_ARGUMENT = "octo/private-repo-name"


def _tenant(name: str, sandbox: str, token_ref: str, port: int, limits: dict[str, int] | None = None) -> str:
    rules: list[dict[str, Any]] = [
        {
            "id": "mcp-ws",
            "hosts": ["api.test"],
            "ports": [port],
            "websocket": True,
            "mcp": {"tools": {"allow": ["search_*"], "deny": ["delete_*"]}},
        },
        {
            "id": "rpc-ws",
            "hosts": ["x.api.test"],
            "ports": [port],
            "websocket": True,
            "jsonrpc": {"methods": {"allow": ["eth_*"], "deny": ["eth_sendTransaction"]}},
        },
    ]
    doc: dict[str, Any] = {"tenant": name, "sandboxes": [{"id": sandbox, "token": token_ref}], "allow": rules}
    if limits:
        doc["limits"] = limits
    return yaml.safe_dump(doc, sort_keys=False)


class WebSocketUpstream:
    """aiohttp's WebSocket server over TLS on UPSTREAM_IP, in a thread of its own: `events[i]` holds
    connection i's whole messages, `("text", str)` or `("bytes", bytes)`, then `("eof",)`."""

    def __init__(self, pki: TestPKI) -> None:
        self.port = free_port(UPSTREAM_IP)
        self.events: list[list[tuple[Any, ...]]] = []
        self._tls = pki.server_context()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *_: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()  # its selector's sockets too: left to gc, they fail a later test

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/ws", self._serve)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, UPSTREAM_IP, self.port, ssl_context=self._tls).start()

    async def _serve(self, request: web.Request) -> web.WebSocketResponse:
        events: list[tuple[Any, ...]] = []
        self.events.append(events)  # before the handshake's answer: the guest counts on it
        ws = web.WebSocketResponse(compress=True)
        await ws.prepare(request)
        async for message in ws:
            if message.type is aiohttp.WSMsgType.TEXT:
                events.append(("text", message.data))
                await ws.send_str("echo: " + message.data)
            elif message.type is aiohttp.WSMsgType.BINARY:
                events.append(("bytes", message.data))
        events.append(("eof",))
        return ws

    def wait_for(self, conn: int, kind: str, timeout: float = 10.0) -> bool:
        """Whether connection `conn` recorded an event of `kind` within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.events) > conn and any(e[0] == kind for e in self.events[conn]):
                return True
            time.sleep(0.02)
        return False


@pytest.fixture(scope="module")
def upstream(pki: TestPKI) -> Iterator[WebSocketUpstream]:
    with WebSocketUpstream(pki) as up:
        yield up


@pytest.fixture(scope="module")
def gateway(start_module_gateway: GatewayFactory, upstream: WebSocketUpstream) -> RunningGateway:
    """t1 (sb1): no limits; t2 (sb2): 4 requests a minute (the handshake is one)."""
    return start_module_gateway(
        {
            "t1.yaml": _tenant("t1", "sb1", TOKEN_REF, upstream.port),
            "t2.yaml": _tenant("t2", "sb2", OTHER_TOKEN_REF, upstream.port, {"requests_per_minute": 4}),
        }
    )


@pytest.fixture
def gw(gateway: RunningGateway) -> RunningGateway:
    gateway.mark()
    return gateway


def _guest(
    gw: RunningGateway, up: WebSocketUpstream, host: str = "api.test", sb2: bool = False
) -> WebSocketGuest:
    credentials = ("sb2", OTHER_TOKEN) if sb2 else ("sb1", TOKEN)
    return WebSocketGuest(gw.port, gw.ca_file, host, up.port, credentials)


def _call(rid: int, tool: str, arguments: dict[str, Any] | None = None) -> str:
    params = {"name": tool, "arguments": arguments or {}}
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params})


def _texts(guest: WebSocketGuest) -> list[str]:
    return [e.data for e in guest.events if isinstance(e, TextMessage)]


def _next_text(guest: WebSocketGuest, seen: int) -> str:
    """The text message after the first `seen` ones (waiting for it)."""
    assert guest.wait(lambda _: len(_texts(guest)) > seen), guest.events
    return _texts(guest)[seen]


def _upstream_texts(up: WebSocketUpstream, conn: int, count: int) -> list[str]:
    """The texts connection `conn` of the upstream got, once it has `count` (or after 5 s)."""
    deadline = time.monotonic() + 5
    while True:
        texts = [r[1] for r in (up.events[conn] if len(up.events) > conn else []) if r[0] == "text"]
        if len(texts) >= count or time.monotonic() > deadline:
            return texts
        time.sleep(0.02)


def _message_records(gw: RunningGateway, count: int) -> list[dict[str, Any]]:
    found = gw.records_until(lambda rs: len([r for r in rs if "websocket" in r]) >= count)
    return sorted((r for r in found if "websocket" in r), key=lambda r: r["websocket"]["message"])


def _assert_clean_log(gw: RunningGateway) -> None:
    """A refusal is not a crash: no traceback, no mitmproxy crash report."""
    time.sleep(0.3)
    log = gw.log()
    assert "Traceback" not in log and "crashed" not in log and '"level": "error"' not in log, log[-3000:]


def test_a_denied_tool_is_answered_in_the_session_and_the_session_goes_on(
    gw: RunningGateway, upstream: WebSocketUpstream
) -> None:
    conn = len(upstream.events)
    guest = _guest(gw, upstream)
    try:
        guest.send(TextMessage(_call(1, "search_issues", {"q": SECRET_ARGUMENT})))
        assert _next_text(guest, 0) == "echo: " + _call(1, "search_issues", {"q": SECRET_ARGUMENT})
        guest.send(TextMessage(_call(2, "delete_repo", {"repo": SECRET_ARGUMENT})))
        answer = json.loads(_next_text(guest, 1))
        assert answer["id"] == 2 and answer["error"]["code"] == -32001
        assert (answer["error"]["data"]["reason"], answer["error"]["data"]["rule"]) == (
            "tool_denied",
            "mcp.tools.deny[0]",
        )
        guest.send(TextMessage(_call(3, "search_code")))
        assert _next_text(guest, 2) == "echo: " + _call(3, "search_code")
        assert not any(isinstance(e, CloseConnection) for e in guest.events)
    finally:
        guest.close()
    assert [json.loads(t)["id"] for t in _upstream_texts(upstream, conn, 2)] == [1, 3]

    records = _message_records(gw, 3)
    (handshake,) = [r for r in gw.records() if r.get("status") == 101]
    facts = [
        (r["decision"], r["reason"], r["mcp"]["messages"][0]["tool"], r["websocket"]["message"])
        for r in records
    ]
    assert facts == [
        ("allow", "allowed", "search_issues", 1),
        ("deny", "tool_denied", "delete_repo", 2),
        ("allow", "allowed", "search_code", 3),
    ]
    assert {r["websocket"]["session"] for r in records} == {handshake["decision_id"]}
    assert records[1]["decision_id"] == answer["error"]["data"]["decision_id"]
    assert records[1]["mcp"]["rule"] == "mcp.tools.deny[0]"
    assert len(records[1]["mcp"]["messages"][0]["arguments_sha256"]) == 64
    assert SECRET_ARGUMENT not in json.dumps(gw.records()), "an argument value reached the audit trail"
    _assert_clean_log(gw)


@pytest.mark.parametrize(
    ("tool", "refused"), [("delete_repo", True), ("search_issues", False)], ids=["denied", "allowed"]
)
def test_a_call_split_across_fragments_is_decided_as_the_whole_message(
    gw: RunningGateway, upstream: WebSocketUpstream, tool: str, refused: bool
) -> None:
    text = _call(7, tool)
    cut = text.index(tool) + 3  # the tool's name itself is split: `del` | `ete_repo`
    pieces = [text[:10], text[10:cut], text[cut:]]
    conn = len(upstream.events)
    guest = _guest(gw, upstream)
    try:
        for i, piece in enumerate(pieces):
            guest.send(TextMessage(piece, message_finished=i == len(pieces) - 1))
            time.sleep(0.05)  # each frame on its own: the gateway holds the message, not the wire
        reply = _next_text(guest, 0)
    finally:
        guest.close()
    if refused:
        assert json.loads(reply)["error"]["data"]["reason"] == "tool_denied"
        assert upstream.wait_for(conn, "eof") and _upstream_texts(upstream, conn, 1) == []
    else:
        assert reply == "echo: " + text
        assert _upstream_texts(upstream, conn, 1) == [text]
    (record,) = _message_records(gw, 1)
    assert (record["decision"], record["reason"], record["mcp"]["messages"][0]["tool"]) == (
        "deny" if refused else "allow",
        "tool_denied" if refused else "allowed",
        tool,
    )


@pytest.mark.parametrize(
    ("message", "code", "problem"),
    [
        (BytesMessage(_call(4, "search_issues").encode()), -32600, None),
        (TextMessage("search_issues please"), -32700, "not_json"),
        (TextMessage('{"jsonrpc":"2.0","id":4,"id":5,"method":"ping"}'), -32700, "duplicate_key"),
        (TextMessage('{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"a b"}}'), -32600, None),
    ],
    ids=[
        "a binary message is refused as invalid_request",
        "a text that is not JSON is a parse error",
        "a duplicate key is a parse error",
        "a tool name outside the allowed characters is invalid_request",
    ],
)
def test_an_unreadable_message_is_answered_invalid_request_and_never_forwarded(
    gw: RunningGateway, upstream: WebSocketUpstream, message: Any, code: int, problem: str | None
) -> None:
    conn = len(upstream.events)
    guest = _guest(gw, upstream)
    try:
        guest.send(message)
        answer = json.loads(_next_text(guest, 0))
        guest.send(TextMessage(_call(5, "search_issues")))
        assert _next_text(guest, 1).startswith("echo: "), "the session goes on"
    finally:
        guest.close()
    assert answer["error"]["code"] == code and answer["error"]["data"]["reason"] == "invalid_request"
    assert [json.loads(t)["id"] for t in _upstream_texts(upstream, conn, 1)] == [5]
    records = _message_records(gw, 2)
    assert [(r["decision"], r["reason"]) for r in records] == [
        ("deny", "invalid_request"),
        ("allow", "allowed"),
    ]
    if problem is not None:
        assert records[0]["mcp"]["problem"] == problem


def test_a_batch_with_a_denied_call_is_refused_whole_each_id_answered(
    gw: RunningGateway, upstream: WebSocketUpstream
) -> None:
    batch = [json.loads(_call(1, "search_issues")), json.loads(_call(2, "DELETE_repo"))]
    conn = len(upstream.events)
    guest = _guest(gw, upstream)
    try:
        guest.send(TextMessage(json.dumps(batch)))
        answer = json.loads(_next_text(guest, 0))
    finally:
        guest.close()
    assert [(a["id"], a["error"]["data"]["reason"]) for a in answer] == [
        (1, "batch_refused"),
        (2, "tool_denied"),
    ]
    assert upstream.wait_for(conn, "eof") and _upstream_texts(upstream, conn, 1) == []
    (record,) = _message_records(gw, 1)
    assert (record["reason"], record["mcp"]["batch"]) == ("tool_denied", 2)


def test_a_jsonrpc_rule_decides_each_method_and_the_upstream_answers_pass(
    gw: RunningGateway, upstream: WebSocketUpstream
) -> None:
    conn = len(upstream.events)
    guest = _guest(gw, upstream, host="x.api.test")
    send = {"jsonrpc": "2.0", "id": 2, "method": "eth_sendTransaction", "params": [{"to": "0x0"}]}
    try:
        guest.send(TextMessage(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber"})))
        assert _next_text(guest, 0).startswith("echo: ")
        guest.send(TextMessage(json.dumps(send)))
        answer = json.loads(_next_text(guest, 1))
        # A notification of a denied method is refused too, and answered with nothing.
        guest.send(TextMessage(json.dumps({"jsonrpc": "2.0", "method": "admin_peers"})))
        guest.send(TextMessage(json.dumps({"jsonrpc": "2.0", "id": 3, "method": "eth_chainId"})))
        assert json.loads(_next_text(guest, 2).removeprefix("echo: "))["id"] == 3
    finally:
        guest.close()
    assert (answer["id"], answer["error"]["data"]["reason"]) == (2, "rpc_method_not_allowed")
    assert [json.loads(t)["id"] for t in _upstream_texts(upstream, conn, 2)] == [1, 3]
    records = _message_records(gw, 4)
    assert [(r["reason"], r["jsonrpc"]["messages"][0]["method"]) for r in records] == [
        ("allowed", "eth_blockNumber"),
        ("rpc_method_not_allowed", "eth_sendTransaction"),
        ("rpc_method_not_allowed", "admin_peers"),
        ("allowed", "eth_chainId"),
    ]


def test_each_message_counts_as_a_request_and_a_flood_ends_the_session_with_one_record(
    gw: RunningGateway, upstream: WebSocketUpstream
) -> None:
    guest = _guest(gw, upstream, sb2=True)
    try:
        for i in range(3):  # the handshake was the first of the tenant's 4 requests a minute
            guest.send(TextMessage(_call(i, "delete_repo")))
            _next_text(guest, i)
        for i in range(3, 50):
            try:
                guest.send(TextMessage(_call(i, "delete_repo")))
            except OSError:  # ssl.SSLError too
                break  # the gateway already closed the flooded session: what is tested below
        close = guest.close_event()
    finally:
        guest.close()
    assert close is not None and close.code == 1013 and "rate_limited" in (close.reason or "")
    time.sleep(0.5)
    records = _message_records(gw, 4)
    assert [r["reason"] for r in records] == ["tool_denied"] * 3 + ["rate_limited"]
    # The handshake's record, one per decided message, none for the 46 sent after the limit.
    requests = [(r["reason"], r.get("status")) for r in gw.settled() if r["phase"] == "request"]
    assert requests == [("allowed", 101)] + [("tool_denied", None)] * 3 + [("rate_limited", None)]


async def test_a_real_client_library_gets_its_answers_on_the_same_socket(
    gw: RunningGateway, upstream: WebSocketUpstream
) -> None:
    ctx = ssl.create_default_context(cafile=str(gw.ca_file))
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(
            f"wss://api.test:{upstream.port}/ws",
            proxy=f"http://127.0.0.1:{gw.port}",
            proxy_headers={"Proxy-Authorization": aiohttp.encode_basic_auth("sb1", TOKEN)},
            ssl=ctx,
            compress=15,  # permessage-deflate: the gateway decides the inflated message
        ) as ws,
    ):
        await ws.send_str(_call(1, "delete_everything"))
        refused = json.loads(await ws.receive_str(timeout=10))
        await ws.send_str(_call(2, "search_issues"))
        allowed = await ws.receive_str(timeout=10)
    assert refused["error"]["data"]["reason"] == "tool_denied"
    assert allowed == "echo: " + _call(2, "search_issues")
    _assert_clean_log(gw)
