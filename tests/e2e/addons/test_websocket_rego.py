"""The tenant's Rego on MCP tool calls sent over a WebSocket (phase "message"), end to end.

A tenant whose Rego denies `create_issue` outside its repositories (the shipped
rules/rego/examples/mcp_arguments.rego) must not be bypassed by sending the same call over a
WebSocket instead of an HTTP POST. Through a real `sandgate run`, a raw wsproto guest talks
to a recording wsproto upstream (tests/support/ws_peers.py) on a rule with `websocket: true`
and an `mcp:` section that allows the tool: a call naming a listed repository is forwarded;
one naming another is answered on the same socket with a JSON-RPC error carrying the
policy's reason, rule and message, never reaches the upstream, and the session goes on. An
engine fault refuses the call (`policy_error`), in report mode too; report mode forwards a
denied call and records `would_deny`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    OTHER_TOKEN,
    OTHER_TOKEN_REF,
    REPO,
    TOKEN,
    TOKEN_REF,
    UPSTREAM_IP,
    GatewayFactory,
    RunningGateway,
)
from support import TestPKI
from support.ws_peers import WebSocketGuest, WebSocketUpstream
from wsproto.events import CloseConnection, TextMessage

pytestmark = pytest.mark.slow

SECRET_ARGUMENT = "evil/private-repo-name"
MESSAGE = "tool create_issue may act only on this tenant's repositories"
# The shipped example, and a tool whose every message makes the engine fail (a complete rule
# with two values is an evaluation error, as a timeout or an unreachable server would be).
MODULE = """package sandgate.tenants.{tenant}

import rego.v1

import data.sandgate.examples.mcp_arguments

deny contains d if some d in mcp_arguments.deny

conflict := "a" if input.mcp.tool == "explode"

conflict := "b" if input.mcp.tool == "explode"

deny contains "never" if conflict == "c"
"""


def _tenant(name: str, sandbox: str, token_ref: str, port: int, mode: str) -> str:
    doc: dict[str, Any] = {
        "tenant": name,
        "mode": mode,
        "sandboxes": [{"id": sandbox, "token": token_ref}],
        "allow": [
            {
                "id": "mcp-ws",
                "hosts": ["api.test"],
                "ports": [port],
                "websocket": True,
                "mcp": {"tools": {"allow": ["search_*", "create_issue", "explode"], "deny": ["delete_*"]}},
            }
        ],
        "rego": [f"{name}.rego", "../rego/examples/mcp_arguments.rego"],
        "data": {"mcp_repositories": {"tools": ["create_issue"], "repositories": ["octo/app"]}},
    }
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture(scope="module")
def upstream(pki: TestPKI) -> Iterator[WebSocketUpstream]:
    with WebSocketUpstream(UPSTREAM_IP, pki) as up:
        yield up


@pytest.fixture(scope="module")
def gateway(start_module_gateway: GatewayFactory, upstream: WebSocketUpstream) -> RunningGateway:
    """t1 (sb1) enforces; t2 (sb2) reports."""

    def prepare(root: Path) -> None:
        for name in ("t1", "t2"):
            (root / "rules" / "tenants" / f"{name}.rego").write_text(MODULE.format(tenant=name))
        shutil.copytree(REPO / "rules" / "rego", root / "rules" / "rego")

    return start_module_gateway(
        {
            "t1.yaml": _tenant("t1", "sb1", TOKEN_REF, upstream.port, "enforce"),
            "t2.yaml": _tenant("t2", "sb2", OTHER_TOKEN_REF, upstream.port, "report"),
        },
        prepare=prepare,
    )


@pytest.fixture
def gw(gateway: RunningGateway) -> RunningGateway:
    gateway.mark()
    return gateway


def _guest(gw: RunningGateway, up: WebSocketUpstream, *, report: bool = False) -> WebSocketGuest:
    credentials = ("sb2", OTHER_TOKEN) if report else ("sb1", TOKEN)
    return WebSocketGuest(gw.port, gw.ca_file, "api.test", up.port, credentials)


def _call(rid: int, tool: str, arguments: dict[str, Any]) -> str:
    params = {"name": tool, "arguments": arguments}
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params})


def _texts(guest: WebSocketGuest) -> list[str]:
    return [e.data for e in guest.events if isinstance(e, TextMessage)]


def _next_text(guest: WebSocketGuest, seen: int) -> str:
    """The text message after the first `seen` ones (waiting for it)."""
    assert guest.wait(lambda _: len(_texts(guest)) > seen), guest.events
    return _texts(guest)[seen]


def _upstream_texts(up: WebSocketUpstream, conn: int) -> list[str]:
    """The texts connection `conn` of the upstream got, once the guest has gone."""
    return [r[1] for r in up.wait_for(conn, "eof") if r[0] == "text"]


def _message_records(gw: RunningGateway, count: int) -> list[dict[str, Any]]:
    found = gw.records_until(lambda rs: len([r for r in rs if "websocket" in r]) >= count)
    return sorted((r for r in found if "websocket" in r), key=lambda r: r["websocket"]["message"])


def test_rego_refuses_a_call_by_its_arguments_in_the_session_and_the_upstream_never_gets_it(
    gw: RunningGateway, upstream: WebSocketUpstream
) -> None:
    conn = len(upstream.events)
    allowed = _call(1, "create_issue", {"repo": "octo/app", "title": "a"})
    refused = _call(2, "create_issue", {"repo": SECRET_ARGUMENT, "title": "b"})
    after = _call(3, "search_issues", {"q": "x"})
    guest = _guest(gw, upstream)
    try:
        guest.send(TextMessage(allowed))
        assert _next_text(guest, 0) == "echo: " + allowed
        guest.send(TextMessage(refused))
        answer = json.loads(_next_text(guest, 1))
        guest.send(TextMessage(after))
        assert _next_text(guest, 2) == "echo: " + after, "the session goes on"
        assert not any(isinstance(e, CloseConnection) for e in guest.events)
    finally:
        guest.close()
    assert (answer["id"], answer["error"]["code"]) == (2, -32001)
    data = answer["error"]["data"]
    assert (data["reason"], data["rule"], data["detail"]) == (
        "policy_denied",
        "data.sandgate.decision",
        MESSAGE,
    )
    assert _upstream_texts(upstream, conn) == [allowed, after]
    assert SECRET_ARGUMENT not in upstream.all_bytes().decode(), "the refused call reached the upstream"

    records = _message_records(gw, 3)
    assert [(r["decision"], r["reason"], r["websocket"]["message"]) for r in records] == [
        ("allow", "allowed", 1),
        ("deny", "policy_denied", 2),
        ("allow", "allowed", 3),
    ]
    denied = records[1]
    assert denied["decision_id"] == data["decision_id"]
    assert denied["rego"] == {
        "phase": "message",
        "verdict": "deny",
        "evaluated": 1,
        "reason": "policy_denied",
        "rule": "data.sandgate.decision",
    }
    assert (denied["mcp"]["verdict"], denied["mcp"]["messages"][0]["rule"]) == (
        "deny",
        "data.sandgate.decision",
    )
    assert records[0]["rego"] == {"phase": "message", "verdict": "allow", "evaluated": 1}
    trail = json.dumps(gw.records())
    assert SECRET_ARGUMENT not in trail and MESSAGE not in trail, (
        "an argument or the policy's message was recorded"
    )


def test_a_batch_with_a_call_rego_denies_is_refused_whole(
    gw: RunningGateway, upstream: WebSocketUpstream
) -> None:
    batch = [
        json.loads(_call(1, "search_issues", {"q": "x"})),
        json.loads(_call(2, "create_issue", {"repo": "a/b"})),
    ]
    conn = len(upstream.events)
    guest = _guest(gw, upstream)
    try:
        guest.send(TextMessage(json.dumps(batch)))
        answer = json.loads(_next_text(guest, 0))
    finally:
        guest.close()
    assert [(a["id"], a["error"]["data"]["reason"]) for a in answer] == [
        (1, "batch_refused"),
        (2, "policy_denied"),
    ]
    assert _upstream_texts(upstream, conn) == []
    (record,) = _message_records(gw, 1)
    assert (record["reason"], record["mcp"]["batch"], record["rego"]["evaluated"]) == ("policy_denied", 2, 2)


@pytest.mark.parametrize("report", [False, True], ids=["enforce", "report mode"])
def test_an_engine_fault_refuses_the_call_with_policy_error(
    gw: RunningGateway, upstream: WebSocketUpstream, report: bool
) -> None:
    conn = len(upstream.events)
    guest = _guest(gw, upstream, report=report)
    try:
        guest.send(TextMessage(_call(4, "explode", {})))
        answer = json.loads(_next_text(guest, 0))
    finally:
        guest.close()
    assert (answer["id"], answer["error"]["data"]["reason"]) == (4, "policy_error")
    assert _upstream_texts(upstream, conn) == []
    (record,) = _message_records(gw, 1)
    assert (record["decision"], record["reason"], record["rego"]["verdict"]) == (
        "deny",
        "policy_error",
        "deny",
    )


def test_report_mode_forwards_a_denied_call_and_records_would_deny(
    gw: RunningGateway, upstream: WebSocketUpstream
) -> None:
    conn = len(upstream.events)
    refused = _call(5, "create_issue", {"repo": SECRET_ARGUMENT})
    guest = _guest(gw, upstream, report=True)
    try:
        guest.send(TextMessage(refused))
        assert _next_text(guest, 0) == "echo: " + refused
    finally:
        guest.close()
    assert _upstream_texts(upstream, conn) == [refused]
    (record,) = _message_records(gw, 1)
    assert (record["decision"], record["mcp"]["verdict"]) == ("allow", "would_deny")
    assert (record["rego"]["verdict"], record["rego"]["reason"]) == ("would_deny", "policy_denied")
