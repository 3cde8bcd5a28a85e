"""The tenant's Rego on each MCP message (phase "message"), on the whole pipeline in process:
a rule the YAML cannot say (create_issue only when `arguments.repo` is in a set) refuses the
body as a JSON-RPC error naming the reason and the policy's message, records it once without
the argument, fails closed on an engine fault and on a body of unknown length, records
would_deny in report mode, and costs nothing to a tenant whose Rego does not read input.mcp."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, TOKEN, TOKEN_REF
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
from sandgate.policy.rego.engine import make_engine
from sandgate.policy.rego.protocol import PolicyEngine, RegoQuery, RegoVerdict, fault
from sandgate.proxy.addons.agent_protocols import ProtocolBodyRefused
from sandgate.proxy.addons.agent_rego import UNKNOWN_LENGTH
from sandgate.proxy.addons.protocol_bodies import arguments_digest

PORT = 8080
HOSTS = {"mcp.test": ["127.0.0.2"]}
MCP = f"http://mcp.test:{PORT}/mcp"
SECRET_ARGUMENT = "evil/private-repo-name"
EXAMPLE = REPO / "rules" / "rego" / "examples" / "mcp_arguments.rego"
LIBRARY = REPO / "rules" / "rego" / "sandgate.rego"
MESSAGE = "tool create_issue may act only on this tenant's repositories"

# The tenant's module: the shipped example, and a rule on the session.
ARGUMENTS_MODULE = """package sandgate.tenants.t1

import rego.v1

import data.sandgate.examples.mcp_arguments

deny contains d if some d in mcp_arguments.deny

deny contains {"reason": "policy_denied", "message": "open a session first"} if {
\tinput.mcp.tool == "needs_session"
\tinput.mcp.session == null
}
"""
# A tenant whose Rego reads only the request: never asked about messages.
REQUEST_MODULE = """package sandgate.tenants.t1

import rego.v1

deny contains "no deletes" if input.request.method == "DELETE"
"""


def tenant(mode: str, module: str) -> dict[str, str]:
    """The tenant file and its modules (files under rules/); the example only beside the module
    that uses it."""
    example = ["../rego/examples/mcp_arguments.rego"] if "mcp_arguments" in module else []
    doc = {
        "tenant": "t1",
        "mode": mode,
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
        "allow": [
            {
                "id": "mcp",
                "hosts": ["mcp.test"],
                "ports": [PORT],
                "mcp": {
                    "tools": {"allow": ["search_*", "create_issue", "needs_session"], "deny": ["delete_*"]}
                },
            }
        ],
        "rego": ["t1.rego", *example],
        "data": {"mcp_repositories": {"tools": ["create_issue"], "repositories": ["octo/app", "octo/web"]}},
    }
    return {
        "tenants/t1.yaml": yaml.safe_dump(doc, sort_keys=False),
        "tenants/t1.rego": module,
        "rego/sandgate.rego": LIBRARY.read_text(),
        "rego/examples/mcp_arguments.rego": EXAMPLE.read_text(),
    }


class Recording:
    """The embedded engine, recording the phase of every query it is asked."""

    def __init__(self, inner: PolicyEngine) -> None:
        self.inner = inner
        self.name = inner.name
        self.phases: list[str] = []

    async def evaluate(self, query: RegoQuery) -> RegoVerdict:
        self.phases.append(str(query.document["phase"]))
        return await self.inner.evaluate(query)

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        await self.inner.close()


class FaultsOnMessages(Recording):
    """The embedded engine for requests; a fault (as a timeout gives) for every message."""

    async def evaluate(self, query: RegoQuery) -> RegoVerdict:
        if query.document["phase"] == "message":
            self.phases.append("message")
            return fault("the OPA server did not answer within 0.5s")
        return await super().evaluate(query)


@contextmanager
def gateway(
    tmp_path: Path,
    *,
    mode: str = "enforce",
    module: str = ARGUMENTS_MODULE,
    engine: PolicyEngine | None = None,
) -> Iterator[Pipeline]:
    files = tenant(mode, module)
    tenant_file = files.pop("tenants/t1.yaml")
    with whole_pipeline(tmp_path, {"t1.yaml": tenant_file}, HOSTS, engine=engine, files=files) as gw:
        yield gw


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Pipeline]:
    with gateway(tmp_path) as running:
        yield running


def call(tool: str, arguments: dict[str, Any], rpc_id: int | str = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


async def send(
    gw: Pipeline, body: object, *, headers: dict[str, str] | None = None, chunked: bool = False
) -> http.HTTPFlow:
    """One proxy request through the request hooks, then (when not answered) an upstream 200."""
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(
        client,
        MCP,
        method="POST",
        sandbox="sb1",
        token=TOKEN,
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    if chunked:
        del flow.request.headers["content-length"]
        flow.request.headers["Transfer-Encoding"] = "chunked"
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
    assert flow.response is not None and not flow.metadata.get("forwarded"), "not refused by the gateway"
    assert (flow.response.status_code, flow.response.headers["content-type"]) == (200, "application/json")
    return json.loads(flow.response.content or b"")


def one_record(gw: Pipeline) -> dict[str, Any]:
    (record,) = gw.records()
    assert SECRET_ARGUMENT not in json.dumps(record), "an argument value reached the audit trail"
    return record


async def test_a_repository_in_the_set_goes_upstream(gw: Pipeline) -> None:
    flow = await send(gw, call("create_issue", {"repo": "octo/app", "title": "x"}, 7))
    assert flow.metadata.get("forwarded")
    record = one_record(gw)
    assert (record["decision"], record["reason"]) == ("allow", "allowed")
    assert record["rego"] == {"phase": "message", "verdict": "allow", "evaluated": 1}


async def test_a_repository_outside_the_set_is_a_json_rpc_error_naming_the_policys_message(
    gw: Pipeline,
) -> None:
    arguments: dict[str, JsonValue] = {"repo": SECRET_ARGUMENT, "title": "x"}
    flow = await send(gw, call("create_issue", arguments, "call-9"))
    error = answer(flow)
    assert (error["id"], error["error"]["code"]) == ("call-9", -32001)
    data = error["error"]["data"]
    assert (data["reason"], data["rule"], data["detail"]) == (
        "policy_denied",
        "data.sandgate.decision",
        MESSAGE,
    )
    assert flow.response is not None and flow.response.headers["X-Sandgate-Reason"] == "policy_denied"
    record = one_record(gw)
    assert (record["decision"], record["reason"], record["status"]) == ("deny", "policy_denied", 200)
    assert MESSAGE not in json.dumps(record), "the policy's message may quote an argument: not recorded"
    assert record["rego"] == {
        "phase": "message",
        "verdict": "deny",
        "evaluated": 1,
        "reason": "policy_denied",
        "rule": "data.sandgate.decision",
    }
    (message,) = record["mcp"]["messages"]
    assert (message["tool"], message["verdict"], message["rule"]) == (
        "create_issue",
        "deny",
        "data.sandgate.decision",
    )
    assert message["arguments_sha256"] == arguments_digest(arguments)


async def test_a_batch_with_one_refused_call_is_refused_whole(gw: Pipeline) -> None:
    batch = [call("search_issues", {"q": "x"}, 1), call("create_issue", {"repo": SECRET_ARGUMENT}, 2)]
    errors = answer(await send(gw, batch))
    assert [(e["id"], e["error"]["data"]["reason"]) for e in errors] == [
        (1, "batch_refused"),
        (2, "policy_denied"),
    ]
    record = one_record(gw)
    assert (record["reason"], record["mcp"]["batch"], record["rego"]["evaluated"]) == ("policy_denied", 2, 2)


async def test_the_session_header_reaches_rego_as_a_digest(gw: Pipeline) -> None:
    refused = answer(await send(gw, call("needs_session", {})))
    assert refused["error"]["data"]["detail"] == "open a session first"
    flow = await send(gw, call("needs_session", {}), headers={"Mcp-Session-Id": "sess-42"})
    assert flow.metadata.get("forwarded")


async def test_the_yaml_decides_first_and_rego_is_not_asked_about_a_refused_body(gw: Pipeline) -> None:
    error = answer(await send(gw, call("delete_repo", {"repo": SECRET_ARGUMENT})))
    assert error["error"]["data"]["reason"] == "tool_denied"
    record = one_record(gw)
    assert record["reason"] == "tool_denied" and "rego" not in record


async def test_a_body_of_unknown_length_is_refused_at_its_head(gw: Pipeline) -> None:
    flow = await send(gw, call("create_issue", {"repo": "octo/app"}), chunked=True)
    error = answer(flow)
    assert (error["error"]["code"], error["error"]["data"]["reason"]) == (-32600, "invalid_request")
    assert error["error"]["data"]["detail"] == UNKNOWN_LENGTH
    record = one_record(gw)
    assert (record["decision"], record["reason"], record["detail"]) == (
        "deny",
        "invalid_request",
        UNKNOWN_LENGTH,
    )


async def test_an_engine_fault_refuses_with_policy_error_even_in_report_mode(tmp_path: Path) -> None:
    engine = FaultsOnMessages(make_engine("embedded", cache_size=0))
    with gateway(tmp_path, mode="report", engine=engine) as gw:
        error = answer(await send(gw, call("create_issue", {"repo": "octo/app"})))
        assert error["error"]["data"]["reason"] == "policy_error"
        record = one_record(gw)
    assert (record["decision"], record["reason"]) == ("deny", "policy_error")
    assert record["rego"]["verdict"] == "deny" and engine.phases.count("message") == 1


async def test_report_mode_records_would_deny_and_forwards(tmp_path: Path) -> None:
    with gateway(tmp_path, mode="report") as gw:
        flow = await send(gw, call("create_issue", {"repo": SECRET_ARGUMENT}))
        assert flow.metadata.get("forwarded")
        record = one_record(gw)
    assert record["mcp"]["verdict"] == "would_deny"
    assert (record["rego"]["verdict"], record["rego"]["reason"]) == ("would_deny", "policy_denied")


async def test_a_tenant_whose_rego_does_not_read_messages_pays_nothing(tmp_path: Path) -> None:
    engine = Recording(make_engine("embedded", cache_size=0))
    with gateway(tmp_path, module=REQUEST_MODULE, engine=engine) as gw:
        flow = await send(gw, call("create_issue", {"repo": SECRET_ARGUMENT}))
        chunked = await send(gw, call("search_issues", {}), chunked=True)
        records = gw.records()
    assert flow.metadata.get("forwarded") and chunked.metadata.get("forwarded")
    assert "message" not in engine.phases and engine.phases.count("request") == 2
    assert all("rego" not in r for r in records)


async def test_an_http2_get_is_refused_at_its_first_body_byte_and_goes_on_without_one(gw: Pipeline) -> None:
    async def get() -> http.HTTPFlow:
        client = tflow.tclient_conn()
        await gw.connect(client)
        flow = proxy_flow(client, MCP, sandbox="sb1", token=TOKEN, headers={"Accept": "text/event-stream"})
        flow.request.http_version = "HTTP/2.0"
        flow.request.headers.pop("content-length", None)
        await gw.hook(HttpRequestHeadersHook(flow))
        return flow

    # MCP's event stream: a GET that ends with its head; its stream is never called.
    stream_open = await get()
    assert stream_open.response is None and callable(stream_open.request.stream)
    # A GET whose body starts: refused before any of it is held or sent.
    smuggled = await get()
    stream = smuggled.request.stream
    assert callable(stream)
    with pytest.raises(ProtocolBodyRefused):
        stream(json.dumps(call("create_issue", {"repo": SECRET_ARGUMENT})).encode())
    assert smuggled.response is not None
    assert json.loads(smuggled.response.content or b"")["error"]["data"]["detail"] == UNKNOWN_LENGTH
    await gw.hook(HttpResponseHook(smuggled))
    records = [r for r in gw.records() if r["decision"] == "deny"]
    assert [(r["reason"], r["detail"]) for r in records] == [("invalid_request", UNKNOWN_LENGTH)]
