"""MCP tool calls an `mcp.tools.ask` glob matched, held for a person on the pipeline in process
(the gates, the limits, AgentProtocols and the record's completion, with a real pending
store): released as the bytes that were decided, refused as JSON-RPC errors for their ids,
let through by a tool grant (only by one for that tool, and those arguments), never
approved automatically, and never recorded with an argument's value."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TOKEN, tenant_yaml
from mitmproxy import http
from mitmproxy.connection import ConnectionState
from mitmproxy.proxy.layers.http._hooks import (
    HttpRequestHeadersHook,
    HttpRequestHook,
    HttpResponseHeadersHook,
    HttpResponseHook,
)
from mitmproxy.test import tflow
from support.inprocess import InProcess, in_process, proxy_flow

from sandgate.policy.model.grants import Grant, Grants
from sandgate.policy.protocols.arguments import ArgumentPredicate
from sandgate.policy.protocols.json_strict import JsonValue
from sandgate.proxy.addons.agent_protocols import AgentProtocols
from sandgate.proxy.addons.audit_completion import AuditCompletion
from sandgate.proxy.addons.dial_guard import DialGuard
from sandgate.proxy.addons.identify import Identify
from sandgate.proxy.addons.limits import TenantLimits
from sandgate.proxy.addons.pipeline import Shared
from sandgate.proxy.addons.protocol_bodies import arguments_digest
from sandgate.proxy.addons.request_gate import RequestGate
from sandgate.proxy.addons.tunnel_gate import TunnelGate
from sandgate.proxy.approvals import Approvals
from sandgate.proxy.approvals.auto import AutoApprover
from sandgate.proxy.approvals.grants import grant_record
from sandgate.proxy.approvals.store import AccessRequest
from sandgate.proxy.approvals.tool_calls import PREVIEW_MAX
from sandgate.proxy.approvals.uses import CountedUses, StateFileUseCount
from sandgate.proxy.audit.intents import CUT_BY_EXIT, IntentJournal, read_leftovers

PORT = 8080
HOSTS = {"mcp.test": ["127.0.0.2"]}
MCP = f"http://mcp.test:{PORT}/mcp"
SECRET_ARGUMENT = "octo/private-repo-name"
PLACEHOLDER = "sgph_abcdefghijklmnopqrstuvwxyz234567"
ADDONS = {Identify, TunnelGate, RequestGate, DialGuard, TenantLimits, AgentProtocols, AuditCompletion}


def tenant(mode: str = "enforce") -> str:
    rules = [
        {
            "id": "mcp",
            "hosts": ["mcp.test"],
            "ports": [PORT],
            "mcp": {"tools": {"allow": ["search_*"], "ask": ["merge_*"], "deny": ["delete_*"]}},
        }
    ]
    return tenant_yaml("t1", rules, mode=mode)


@pytest.fixture
def approvals() -> Approvals:
    return Approvals(timeout=30, max_held=4)


@pytest.fixture
def gw(tmp_path: Path, approvals: Approvals) -> Iterator[InProcess]:
    with in_process(
        tmp_path, {"t1.yaml": tenant()}, HOSTS, ADDONS, shared=Shared(approvals=approvals)
    ) as running:
        yield running


def call(tool: str, arguments: dict[str, Any], rpc_id: int | str = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


class Sent:
    """One proxy request whose hooks run in a task (a held one waits there)."""

    def __init__(self, flow: http.HTTPFlow, task: asyncio.Task[None], body: bytes) -> None:
        self.flow, self.task, self.body = flow, task, body

    async def done(self) -> http.HTTPFlow:
        await asyncio.wait_for(self.task, 10)
        return self.flow

    def forwarded(self) -> bool:
        return bool(self.flow.metadata.get("forwarded"))


async def start(
    gw: InProcess,
    body: object,
    *,
    headers: dict[str, str] | None = None,
    upstream: Callable[[], None] = lambda: None,
) -> Sent:
    content = json.dumps(body).encode()
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(
        client,
        MCP,
        method="POST",
        sandbox="sb1",
        token=TOKEN,
        content=content,
        headers={"Content-Type": "application/json", **(headers or {})},
    )

    async def run() -> None:
        await gw.hook(HttpRequestHeadersHook(flow))
        if flow.response is None:
            await gw.hook(HttpRequestHook(flow))
        if flow.response is None:
            # What mitmproxy would send upstream now: the request as the hooks left it.
            upstream()  # what runs as the request goes upstream
            flow.metadata["forwarded"] = True
            flow.metadata["sent"] = flow.request.raw_content
            flow.response = http.Response.make(200, b'{"jsonrpc":"2.0","id":1,"result":{}}')
            await gw.hook(HttpResponseHeadersHook(flow))
        await gw.hook(HttpResponseHook(flow))

    return Sent(flow, asyncio.create_task(run()), content)


async def until_held(approvals: Approvals, count: int = 1) -> list[AccessRequest]:
    for _ in range(500):
        held = [r for r in approvals.listing() if r.state.value == "held"]
        if len(held) >= count:
            return held
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} requests were not held")


def rpc_error(flow: http.HTTPFlow) -> Any:
    assert flow.response is not None and not flow.metadata.get("forwarded"), "it went upstream"
    assert flow.response.status_code == 200
    return json.loads(flow.response.content or b"")


def no_values(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    text = json.dumps(records)
    assert SECRET_ARGUMENT not in text and PLACEHOLDER not in text, "an argument value reached the trail"
    return records


async def test_an_asked_call_is_held_then_released_as_the_bytes_decided(
    gw: InProcess, approvals: Approvals
) -> None:
    arguments: dict[str, JsonValue] = {"repo": SECRET_ARGUMENT, "number": 7}
    sent = await start(gw, call("merge_pull", arguments, 11))
    [held] = await until_held(approvals)
    await asyncio.sleep(0.05)
    assert not sent.task.done() and sent.flow.response is None, "nothing goes on while it is held"
    view = held.view()
    assert (view["tool"], view["method"], view["path"], view["host"]) == (
        "merge_pull",
        "POST",
        "/mcp",
        "mcp.test",
    )
    [shown] = view["tool_calls"]
    assert shown["arguments_sha256"] == arguments_digest(arguments)
    assert json.loads(shown["arguments_preview"]) == arguments

    approvals.settle(held.id, approve=True, by="alice", reason=None)
    flow = await sent.done()
    assert sent.forwarded() and flow.metadata["sent"] == sent.body, "released as the very bytes decided"
    ask, end = no_values(gw.records())
    assert (ask["decision"], ask["reason"], ask["approval_id"]) == ("ask", "approval_required", held.id)
    assert ask["mcp"]["messages"][0]["tool"] == "merge_pull"
    assert ask["mcp"]["messages"][0]["arguments_sha256"] == arguments_digest(arguments)
    assert (end["decision"], end["reason"], end["status"]) == ("allow", "allowed", 200)
    assert (end["approval"]["id"], end["approval"]["by"]) == (held.id, "alice")
    assert end["approval"]["waited_seconds"] >= 0
    assert end["mcp"]["messages"][0]["verdict"] == "allow"


@pytest.mark.parametrize("approve", [True, False], ids=["released", "denied"])
async def test_a_death_while_a_call_is_held_leaves_a_refusal_not_the_exchanges_allow(
    gw: InProcess, approvals: Approvals, tmp_path: Path, approve: bool
) -> None:
    journal = IntentJournal(tmp_path / "journal", pid=4344)
    gw.ctx.audit._journal = journal

    def left() -> list[dict[str, Any]]:
        """What a death now would write for this process (its journal's open intents)."""
        [leftovers] = read_leftovers(journal.path.parent, lambda pid: False)
        return leftovers.records

    at_upstream: list[list[dict[str, Any]]] = []
    sent = await start(
        gw, call("merge_pull", {"repo": SECRET_ARGUMENT}), upstream=lambda: at_upstream.append(left())
    )
    [held] = await until_held(approvals)
    # The exchange was allowed (its place reserved) before its body was read; held, nothing
    # went upstream: a death now is recorded as a refusal tied to the hold, not as an allow.
    [cut] = left()
    assert (cut["decision"], cut["reason"], cut["error"], cut["status"]) == (
        "deny",
        "internal_error",
        CUT_BY_EXIT,
        None,
    )
    assert cut["approval"]["id"] == held.id
    approvals.settle(held.id, approve=approve, by="alice", reason=None)
    await sent.done()
    if approve:
        # Released: on its way upstream, a death would cut the allowed exchange.
        [[going]] = at_upstream
        assert (going["decision_id"], going["decision"], going["error"]) == (
            cut["decision_id"],
            "allow",
            CUT_BY_EXIT,
        )
    else:
        assert at_upstream == [] and not sent.forwarded()
    _, end = no_values(gw.records())
    assert end["decision_id"] == cut["decision_id"] and end["approval"]["id"] == held.id
    assert end["decision"] == ("allow" if approve else "deny")
    assert journal.open_intents == 0, "the exchange's record closed its intent"
    assert gw.ctx.audit._displaced == {}


async def test_a_released_call_whose_reservation_cannot_be_journaled_again_is_refused(
    gw: InProcess, approvals: Approvals, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = IntentJournal(tmp_path / "journal", pid=4346)
    gw.ctx.audit._journal = journal
    sent = await start(gw, call("merge_pull", {"repo": SECRET_ARGUMENT}, 9))
    [held] = await until_held(approvals)
    monkeypatch.setattr(journal, "restore", lambda *args, **kwargs: False)  # a full disk under it
    approvals.settle(held.id, approve=True, by="alice", reason=None)
    error = rpc_error(await sent.done())
    assert (error["id"], error["error"]["data"]["reason"]) == (9, "internal_error")
    _, end = no_values(gw.records())
    assert (end["decision"], end["reason"], end["detail"]) == (
        "deny",
        "internal_error",
        "audit journal failed",
    )
    assert end["approval"]["id"] == held.id, "still tied to its hold"


@pytest.mark.parametrize(
    ("settle", "reason"),
    [("deny", "approval_denied"), ("drain", "internal_error")],
    ids=["an operator denies it", "the gateway drains"],
)
async def test_a_refused_held_call_is_a_json_rpc_error_for_its_id(
    gw: InProcess, approvals: Approvals, settle: str, reason: str
) -> None:
    sent = await start(gw, call("merge_pull", {"repo": SECRET_ARGUMENT}, "m-1"))
    [held] = await until_held(approvals)
    if settle == "deny":
        approvals.settle(held.id, approve=False, by="bob", reason="no")
    else:
        assert approvals.cut_held() == 1
    error = rpc_error(await sent.done())
    assert (error["id"], error["error"]["data"]["reason"]) == ("m-1", reason)
    assert sent.flow.response is not None and sent.flow.response.headers["X-Sandgate-Reason"] == reason
    _, end = no_values(gw.records())
    assert (end["decision"], end["reason"], end["status"]) == ("deny", reason, 200)
    assert end["approval"]["id"] == held.id


async def test_a_held_call_times_out_as_approval_timeout(tmp_path: Path) -> None:
    approvals = Approvals(timeout=0.3, max_held=4)
    with in_process(tmp_path, {"t1.yaml": tenant()}, HOSTS, ADDONS, shared=Shared(approvals=approvals)) as gw:
        sent = await start(gw, call("merge_pull", {}, 3))
        error = rpc_error(await sent.done())
        assert error["error"]["data"]["reason"] == "approval_timeout"


async def test_a_batch_with_an_asked_call_is_held_whole_and_one_approval_releases_it(
    gw: InProcess, approvals: Approvals
) -> None:
    batch = [call("search_issues", {"q": SECRET_ARGUMENT}, 1), call("merge_pull", {"n": 1}, 2)]
    sent = await start(gw, batch)
    [held] = await until_held(approvals)
    assert [c.tool for c in held.calls] == ["merge_pull"], "the operator sees the call that asks"
    approvals.settle(held.id, approve=True, by="alice", reason=None)
    await sent.done()
    assert sent.forwarded() and sent.flow.metadata["sent"] == sent.body


async def test_a_denied_batch_answers_each_id_the_allowed_member_batch_refused(
    gw: InProcess, approvals: Approvals
) -> None:
    sent = await start(gw, [call("search_issues", {}, 1), call("merge_pull", {}, 2)])
    [held] = await until_held(approvals)
    approvals.settle(held.id, approve=False, by=None, reason=None)
    errors = rpc_error(await sent.done())
    assert [(e["id"], e["error"]["data"]["reason"]) for e in errors] == [
        (1, "batch_refused"),
        (2, "approval_denied"),
    ]


async def test_a_batch_with_a_denied_member_is_refused_without_asking(
    gw: InProcess, approvals: Approvals
) -> None:
    sent = await start(gw, [call("merge_pull", {}, 1), call("delete_repo", {}, 2)])
    errors = rpc_error(await sent.done())
    assert errors[1]["error"]["data"]["reason"] == "tool_denied"
    assert approvals.listing() == []


def tool_grant(**fields: Any) -> Grant:
    base: dict[str, Any] = {
        "id": "ab12cd34ef56",
        "tenant": "t1",
        "sandbox": "sb1",
        "host": "mcp.test",
        "port": PORT,
        "methods": frozenset({"POST"}),
        "paths": ("/mcp",),
        "by": "alice",
        "at": time.time(),
        "origin": "state",
    }
    return Grant(**(base | fields))


async def test_a_tool_grant_for_those_arguments_lets_the_call_through_without_asking(
    gw: InProcess, approvals: Approvals
) -> None:
    arguments: dict[str, JsonValue] = {"repo": SECRET_ARGUMENT}
    gw.ctx.grants = Grants([tool_grant(tool="merge_pull", arguments_sha256=arguments_digest(arguments))])
    sent = await start(gw, call("merge_pull", arguments))
    await sent.done()
    assert sent.forwarded() and approvals.listing() == []
    [record] = no_values(gw.records())
    assert (record["decision"], record["approval"]["id"]) == ("allow", "ab12cd34ef56")
    assert record["mcp"]["messages"][0]["rule"] == "t1/grant/ab12cd34ef56"


@pytest.mark.parametrize(
    ("grant", "tool", "arguments"),
    [
        ({"tool": "merge_pull", "arguments_sha256": "0" * 64}, "merge_pull", {"repo": "other"}),
        ({"tool": "merge_pull"}, "merge_branch", {}),
        ({"tool": "merge_pull", "sandbox": "sb2"}, "merge_pull", {}),
        ({"tool": "merge_pull", "paths": ("/other",)}, "merge_pull", {}),
        ({"tool": "merge_pull", "expires": time.time() - 1}, "merge_pull", {}),
        ({"tool": "merge_pull", "arguments": (ArgumentPredicate(path="n", max=5),)}, "merge_pull", {"n": 9}),
        ({}, "merge_pull", {}),
    ],
    ids=[
        "other arguments than the grant's digest",
        "another tool",
        "another sandbox's grant",
        "another path",
        "an expired grant",
        "arguments that fail the grant's predicate",
        "a host grant (no tool) never releases a tool call",
    ],
)
async def test_a_call_no_tool_grant_covers_is_still_held(
    gw: InProcess, approvals: Approvals, grant: dict[str, Any], tool: str, arguments: dict[str, Any]
) -> None:
    gw.ctx.grants = Grants([tool_grant(**grant)])
    sent = await start(gw, call(tool, arguments))
    [held] = await until_held(approvals)
    approvals.settle(held.id, approve=False, by=None, reason=None)
    await sent.done()
    assert not sent.forwarded()


async def test_a_tool_grant_with_predicates_covers_arguments_that_pass_them(
    gw: InProcess, approvals: Approvals
) -> None:
    predicate = ArgumentPredicate(path="n", max=5)
    gw.ctx.grants = Grants([tool_grant(tool="merge_pull", arguments=(predicate,))])
    sent = await start(gw, call("merge_pull", {"n": 3}))
    await sent.done()
    assert sent.forwarded() and approvals.listing() == []


async def test_the_preview_is_bounded_and_masks_placeholders(gw: InProcess, approvals: Approvals) -> None:
    arguments = {"a_token": f"Bearer {PLACEHOLDER.upper()}", "body": "x" * 5000}
    sent = await start(gw, call("merge_pull", arguments))
    [held] = await until_held(approvals)
    preview = held.calls[0].arguments_preview
    assert len(preview) <= PREVIEW_MAX and "truncated" in preview
    assert PLACEHOLDER not in preview.lower() and "Bearer <placeholder>" in preview
    approvals.settle(held.id, approve=False, by=None, reason=None)
    await sent.done()


async def test_a_client_that_hangs_up_while_held_ends_the_hold(gw: InProcess, approvals: Approvals) -> None:
    sent = await start(gw, call("merge_pull", {}))
    [held] = await until_held(approvals)
    sent.flow.client_conn.state = ConnectionState.CAN_WRITE  # its read side saw the EOF
    await sent.done()
    assert not sent.forwarded() and held.state.value == "client_gone"
    _, end = gw.records()
    assert (end["decision"], end["reason"]) == ("deny", "approval_required")


async def test_in_report_mode_an_asked_call_goes_on_recorded_as_would_deny(tmp_path: Path) -> None:
    approvals = Approvals(timeout=30, max_held=4)
    tenants = {"t1.yaml": tenant(mode="report")}
    with in_process(tmp_path, tenants, HOSTS, ADDONS, shared=Shared(approvals=approvals)) as gw:
        sent = await start(gw, call("merge_pull", {}))
        await sent.done()
        assert sent.forwarded() and approvals.listing() == []
        [record] = gw.records()
        assert (record["mcp"]["verdict"], record["mcp"]["reason"]) == ("would_deny", "approval_required")


async def test_without_a_store_an_asked_call_is_refused_approval_required(tmp_path: Path) -> None:
    with in_process(tmp_path, {"t1.yaml": tenant()}, HOSTS, ADDONS) as gw:
        sent = await start(gw, call("merge_pull", {}, 5))
        error = rpc_error(await sent.done())
        assert (error["id"], error["error"]["data"]["reason"]) == (5, "approval_required")


class BrokenStore(Approvals):
    """A pending store that fails to hold anything (a fault in the approval machinery)."""

    def hold(self, **_: Any) -> AccessRequest:
        raise RuntimeError("the store broke")


async def test_a_fault_while_holding_denies_internal_error(tmp_path: Path) -> None:
    approvals = BrokenStore(timeout=30, max_held=4)
    with in_process(tmp_path, {"t1.yaml": tenant()}, HOSTS, ADDONS, shared=Shared(approvals=approvals)) as gw:
        sent = await start(gw, call("merge_pull", {}))
        flow = await sent.done()
        assert not sent.forwarded()
        assert flow.response is not None and flow.response.headers["X-Sandgate-Reason"] == "internal_error"


async def test_a_tool_call_is_never_approved_automatically(tmp_path: Path, approvals: Approvals) -> None:
    ceiling = tmp_path / "ceiling.yaml"
    ceiling.write_text("regions:\n  - hosts: ['*']\n")  # everything: a request would be approved
    with in_process(tmp_path, {"t1.yaml": tenant()}, HOSTS, ADDONS, shared=Shared(approvals=approvals)) as gw:
        approver = AutoApprover(ceiling, lambda: gw.ctx.policy, approvals, _never)
        approvals.on_opened.append(approver.opened)
        sent = await start(gw, call("merge_pull", {}))
        [held] = await until_held(approvals)
        await asyncio.sleep(0.2)
        assert held.state.value == "held", "approved without a person"
        assert approver.verdict(held) is not None
        approvals.settle(held.id, approve=False, by=None, reason=None)
        await sent.done()


async def _never(request_id: str, scope: str, reason: str) -> None:
    raise AssertionError("a proposal was granted")


async def test_a_chunked_asked_call_is_refused_saying_to_send_a_content_length(
    gw: InProcess, approvals: Approvals
) -> None:
    body = json.dumps(call("merge_pull", {"repo": SECRET_ARGUMENT}, 8)).encode()
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(
        client, MCP, method="POST", sandbox="sb1", token=TOKEN, headers={"Transfer-Encoding": "chunked"}
    )
    del flow.request.headers["content-length"]
    await gw.hook(HttpRequestHeadersHook(flow))
    stream = flow.request.stream
    assert callable(stream)
    assert stream(body) == b""
    with pytest.raises(Exception, match="approval_required"):
        stream(b"")
    error = rpc_error(flow)
    assert (error["id"], error["error"]["data"]["reason"]) == (8, "approval_required")
    assert "Content-Length" in error["error"]["data"]["detail"]
    assert approvals.listing() == []
    [record] = no_values(gw.records())
    assert (record["decision"], record["reason"]) == ("deny", "approval_required")


def counting(folder: Path, emitted: list[dict[str, Any]]) -> CountedUses:
    """The gateway's counter of grant uses without redis (a file per grant in `folder`)."""

    async def emit(record: dict[str, Any]) -> bool:
        emitted.append(record)
        return True

    count = StateFileUseCount(folder)
    return CountedUses(
        count, emit, lambda g, n: grant_record(g, "exhausted", where=count.where, by=None, uses=n)
    )


async def test_a_counted_tool_grant_releases_exactly_its_uses_then_the_call_is_held(
    gw: InProcess, approvals: Approvals, tmp_path: Path
) -> None:
    emitted: list[dict[str, Any]] = []
    gw.ctx.grants = Grants([tool_grant(tool="merge_pull", max_uses=2)], counting(tmp_path / "uses", emitted))
    for _ in range(2):
        sent = await start(gw, call("merge_pull", {"n": 1}))
        await sent.done()
        assert sent.forwarded() and approvals.listing() == []
    [exhausted] = emitted
    assert (exhausted["action"], exhausted["uses"]) == ("exhausted", 2)
    third = await start(gw, call("merge_pull", {"n": 1}))
    [held] = await until_held(approvals)
    approvals.settle(held.id, approve=False, by=None, reason=None)
    await third.done()
    assert not third.forwarded()


async def test_a_counted_tool_grant_without_a_counter_releases_nothing(
    gw: InProcess, approvals: Approvals
) -> None:
    gw.ctx.grants = Grants([tool_grant(tool="merge_pull", max_uses=5)])  # no counter: fail closed
    sent = await start(gw, call("merge_pull", {}))
    [held] = await until_held(approvals)
    approvals.settle(held.id, approve=False, by=None, reason=None)
    await sent.done()
    assert not sent.forwarded()
