"""A guest's WebSocket message on an MCP rule goes upstream only with its record queued: in
process (the gates, Upgrades, AgentWebsocket and the record's completion on a real trail),
a message whose record finds no place is dropped and its session ends (fail closed), while
with room it is forwarded and recorded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import TOKEN, TOKEN_REF
from mitmproxy import http
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.proxy.layers.http._hooks import (
    HttpRequestHeadersHook,
    HttpRequestHook,
    HttpResponseHeadersHook,
    HttpResponseHook,
)
from mitmproxy.proxy.layers.websocket import WebsocketMessageHook, WebsocketStartHook
from mitmproxy.test import tflow
from mitmproxy.websocket import WebSocketData, WebSocketMessage
from support.inprocess import InProcess, in_process, proxy_flow
from wsproto.frame_protocol import Opcode

from sandgate.proxy.addons.agent_websocket import AgentWebsocket
from sandgate.proxy.addons.audit_completion import AuditCompletion
from sandgate.proxy.addons.dial_guard import DialGuard
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.identify import Identify
from sandgate.proxy.addons.pipeline import Shared
from sandgate.proxy.addons.request_gate import RequestGate
from sandgate.proxy.addons.tunnel_gate import TunnelGate
from sandgate.proxy.addons.upgrades import Upgrades, WebSocketSession
from sandgate.proxy.mitm.closer import ConnectionCloser

PORT = 8080
ADDONS = {Identify, TunnelGate, RequestGate, DialGuard, Upgrades, AgentWebsocket, AuditCompletion}
TENANT = yaml.safe_dump(
    {
        "tenant": "t1",
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
        "allow": [
            {
                "id": "mcp-ws",
                "hosts": ["api.test"],
                "ports": [PORT],
                "websocket": True,
                "mcp": {"tools": {"allow": ["search_*"]}},
            }
        ],
    }
)
CALL = json.dumps(
    {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search_code", "arguments": {}}}
).encode()


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[InProcess]:
    shared = Shared(closer=ConnectionCloser(Proxyserver()))
    with in_process(
        tmp_path, {"t1.yaml": TENANT}, {"api.test": ["127.0.0.2"]}, ADDONS, shared=shared
    ) as running:
        running.tctx.options.websocket = True
        yield running


async def open_session(gw: InProcess) -> http.HTTPFlow:
    """A WebSocket the gates allowed and the upstream accepted (its 101 through the hooks)."""
    client = tflow.tclient_conn()
    await gw.connect(client)
    headers = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    flow = proxy_flow(client, f"http://api.test:{PORT}/ws", sandbox="sb1", token=TOKEN, headers=headers)
    await gw.hook(HttpRequestHeadersHook(flow))
    await gw.hook(HttpRequestHook(flow))
    assert flow.response is None, "the handshake is allowed"
    flow.response = http.Response.make(
        101, headers={"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Accept": "x"}
    )
    await gw.hook(HttpResponseHeadersHook(flow))
    await gw.hook(HttpResponseHook(flow))
    assert Exchange.of(flow).websocket is not None, "the session is open"
    flow.websocket = WebSocketData()
    await gw.hook(WebsocketStartHook(flow))
    return flow


async def send(gw: InProcess, flow: http.HTTPFlow) -> WebSocketMessage:
    assert flow.websocket is not None
    message = WebSocketMessage(Opcode.TEXT, True, CALL)
    flow.websocket.messages.append(message)
    await gw.hook(WebsocketMessageHook(flow))
    return message


async def test_a_message_goes_with_its_record_queued(gw: InProcess) -> None:
    flow = await open_session(gw)
    message = await send(gw, flow)
    assert not message.dropped
    records = gw.records()
    [recorded] = [r for r in records if r.get("websocket")]
    assert (recorded["decision"], recorded["websocket"]["message"]) == ("allow", 1)


async def test_a_message_whose_record_finds_no_place_is_dropped_and_its_session_ends(gw: InProcess) -> None:
    flow = await open_session(gw)
    gw.ctx.audit.close()  # the trail takes nothing more: every emit is refused
    message = await send(gw, flow)
    assert message.dropped, "nothing goes upstream without its record"
    session = Exchange.of(flow).websocket
    assert isinstance(session, WebSocketSession) and session.closed, "the session ends"
