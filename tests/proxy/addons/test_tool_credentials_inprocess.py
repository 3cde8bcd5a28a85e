"""Credentials in tool arguments on the whole pipeline in process: the `mcp:` rule reads the
body, the broker swaps a `tools:` credential's placeholder only inside a bound tool's
arguments (one record naming the credential and the tool), refuses it anywhere else, swaps a
plain body credential in a GraphQL variable, and scrubs the secret from tool results, JSON or
server-sent events cut anywhere."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import TOKEN, tenant_yaml
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

from sandgate.brokers import Broker, Secret
from sandgate.brokers.scrub import secret_forms

PORT = 8080
HOSTS = {"mcp.test": ["127.0.0.2"], "plain.test": ["127.0.0.3"], "gql.test": ["127.0.0.4"]}
# A quote, a slash and a non-ASCII letter: JSON writes it escaped, in more than one way.
SECRET = 'ghp_REAL/"tool"-é-0123456789abcdef'
GQL_SECRET = "gql-REAL-secret-0123456789abcdef"


def tenant() -> str:
    rules: list[dict[str, Any]] = [
        {"id": "mcp", "hosts": ["mcp.test"], "ports": [PORT], "mcp": {"tools": {"allow": ["*"]}}},
        {"id": "plain", "hosts": ["plain.test"], "ports": [PORT]},
        {"id": "gql", "hosts": ["gql.test"], "ports": [PORT], "graphql": {"operation_types": ["mutation"]}},
    ]
    doc = yaml.safe_load(tenant_yaml("t1", rules))
    bound = {"ports": [PORT], "plaintext": True, "inject": {"body": True}}
    doc["credentials"] = [
        {
            "name": "gh",
            "secret": "file:gh.secret",
            "hosts": ["mcp.test", "plain.test", "gql.test"],
            "tools": ["create_issue"],
            **bound,
        },
        {"name": "gql", "secret": "file:gql.secret", "hosts": ["gql.test"], **bound},
    ]
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    broker = Broker(placeholder_key=Secret(b"test-placeholder-key-0123456789abcdef"))
    yield broker
    await broker.aclose()


@pytest.fixture
def gw(tmp_path: Path, broker: Broker) -> Iterator[Pipeline]:
    files = {"tenants/gh.secret": SECRET, "tenants/gql.secret": GQL_SECRET}
    with whole_pipeline(tmp_path, {"t1.yaml": tenant()}, HOSTS, broker=broker, files=files) as running:
        yield running


def placeholder(gw: Pipeline, credential: str = "gh") -> str:
    assert gw.ctx.broker is not None
    found = gw.ctx.broker.placeholder("t1", "sb1", credential)
    assert found is not None
    return found


def call(tool: str, arguments: Any, **params: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, **params},
    }


async def send(gw: Pipeline, host: str, body: Any) -> http.HTTPFlow:
    """One proxy POST through the request hooks; flow.response is set only when refused."""
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(
        client,
        f"http://{host}:{PORT}/mcp",
        method="POST",
        sandbox="sb1",
        token=TOKEN,
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
    )
    await gw.hook(HttpRequestHeadersHook(flow))
    if flow.response is None:
        await gw.hook(HttpRequestHook(flow))
    return flow


async def answer(gw: Pipeline, flow: http.HTTPFlow, body: bytes, content_type: str) -> bytes:
    """The upstream's answer, read whole, through the response hooks: what the guest gets."""
    flow.response = http.Response.make(200, b"", {"Content-Type": content_type})
    flow.response.raw_content = body
    flow.response.headers["content-length"] = str(len(body))
    await gw.hook(HttpResponseHeadersHook(flow))
    await gw.hook(HttpResponseHook(flow))
    assert flow.response is not None
    return flow.response.raw_content or b""


async def streamed(gw: Pipeline, flow: http.HTTPFlow, chunks: list[bytes]) -> list[bytes]:
    """The upstream's event stream chunk by chunk through the stream callable (b"" at the end,
    as mitmproxy does), then the response hook: the pieces the guest gets, in order."""
    flow.response = http.Response.make(200, b"", {"Content-Type": "text/event-stream"})
    del flow.response.headers["content-length"]
    flow.response.headers["transfer-encoding"] = "chunked"
    await gw.hook(HttpResponseHeadersHook(flow))
    stream = flow.response.stream
    assert callable(stream), "an event stream of unknown length is streamed through the scrubber"
    out: list[bytes] = []
    for chunk in [*chunks, b""]:
        got = stream(chunk)
        out.extend([got] if isinstance(got, bytes) else list(got))
    await gw.hook(HttpResponseHook(flow))
    return out


def assert_no_secret(data: bytes | str) -> None:
    raw = data.encode() if isinstance(data, str) else data
    for form in secret_forms(SECRET.encode(), b"x"):
        assert form not in raw, "a form of the secret reached the guest or the trail"


def tool_result(text: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": text}]}}


async def test_a_placeholder_in_a_bound_tools_arguments_reaches_the_tool_as_the_secret(gw: Pipeline) -> None:
    ph = placeholder(gw)
    flow = await send(gw, "mcp.test", call("create_issue", {"title": "x", "token": ph}))
    assert flow.response is None, "refused"
    sent = json.loads(flow.request.raw_content or b"")
    assert sent["params"]["arguments"] == {"title": "x", "token": SECRET}
    assert flow.request.headers["content-length"] == str(len(flow.request.raw_content or b""))
    # The tool echoes what it got: as Python's json writes it, and as JSON text inside the text.
    echo = json.dumps(tool_result(f"got {SECRET} / {json.dumps({'token': SECRET})}")).encode()
    back = await answer(gw, flow, echo, "application/json")
    assert_no_secret(back)
    assert json.loads(back)["result"]["content"][0]["text"].startswith(f"got {ph} / ")
    record, finding = gw.records()
    assert (record["decision"], record["reason"]) == ("allow", "allowed")
    assert (record["credentials"], record["injectors"]) == (["gh"], ["body"])
    assert record["broker"]["tools"] == [{"credential": "gh", "tool": "create_issue"}]
    # The echo was scrubbed: a finding names the credential and how often (never the value).
    assert (finding["event"], finding["kind"], finding["of"]) == (
        "finding",
        "secret_scrubbed",
        record["decision_id"],
    )
    assert finding["counts"] == {"gh": 2}
    assert record["mcp"]["messages"][0]["tool"] == "create_issue"
    assert_no_secret(json.dumps(record))


@pytest.mark.parametrize(
    ("host", "body", "detail"),
    [
        ("mcp.test", lambda ph: call("delete_repo", {"token": ph}), "unbound_tool"),
        ("mcp.test", lambda ph: call("create_issue", {}, _meta={"token": ph}), "misplaced"),
        ("plain.test", lambda ph: call("create_issue", {"token": ph}), "misplaced"),
        (
            "gql.test",
            lambda ph: {"query": "mutation($t: String!) { a(t: $t) }", "variables": {"t": ph}},
            "misplaced",
        ),
    ],
    ids=[
        "to another tool it is refused as unbound_tool",
        "outside the arguments it is refused as misplaced",
        "in a body no mcp rule read it is refused as misplaced",
        "in a GraphQL variable it is refused as misplaced",
    ],
)
async def test_a_tool_credentials_placeholder_anywhere_else_is_refused_once_and_never_forwarded(
    gw: Pipeline, host: str, body: Any, detail: str
) -> None:
    ph = placeholder(gw)
    flow = await send(gw, host, body(ph))
    assert flow.response is not None
    assert flow.response.headers["X-Sandgate-Reason"] == "credential_host_mismatch"
    # Refused after the gate permitted its dial: the permit is withdrawn with it.
    state = gw.ctx.connections.get(flow.client_conn.id)
    assert state is not None and state.dial_permits == {}
    # Refused in the protocol the rule read (the MCP session lives on), else a 403.
    if host == "plain.test":
        assert flow.response.status_code == 403
    elif host == "mcp.test":
        assert flow.response.status_code == 200
        error = json.loads(flow.response.content or b"")["error"]
        assert error["data"]["reason"] == "credential_host_mismatch"
        assert error["data"]["detail"] == detail
    else:
        assert flow.response.status_code == 200
        (error,) = json.loads(flow.response.content or b"")["errors"]
        assert error["extensions"]["reason"] == "credential_host_mismatch"
    assert SECRET.encode() not in (flow.request.raw_content or b"")
    (record,) = gw.records()
    assert (record["decision"], record["reason"], record["detail"]) == (
        "deny",
        "credential_host_mismatch",
        detail,
    )
    assert record["credentials"] == ["gh"]
    if detail == "unbound_tool":
        assert record["broker"]["tools"] == [{"credential": "gh", "tool": "delete_repo"}]
    assert_no_secret(json.dumps(record))


async def test_a_body_credential_is_swapped_in_a_graphql_variable(gw: Pipeline) -> None:
    ph = placeholder(gw, "gql")
    body = {"query": "mutation Login($t: String!) { login(token: $t) { ok } }", "variables": {"t": ph}}
    flow = await send(gw, "gql.test", body)
    assert flow.response is None, "refused"
    assert json.loads(flow.request.raw_content or b"")["variables"] == {"t": GQL_SECRET}
    back = await answer(
        gw, flow, json.dumps({"data": {"login": {"echo": GQL_SECRET}}}).encode(), "application/json"
    )
    assert GQL_SECRET.encode() not in back and ph.encode() in back
    record, finding = gw.records()
    assert (record["decision"], record["credentials"]) == ("allow", ["gql"])
    assert (finding["kind"], finding["counts"]) == ("secret_scrubbed", {"gql": 1})


def events(text: str) -> bytes:
    """An MCP answer as server-sent events: a progress note, then the tool's result."""
    note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
    return (
        b"event: message\r\ndata: " + json.dumps(note).encode() + b"\r\n\r\n"
        b"event: message\r\ndata: " + json.dumps(tool_result(text)).encode() + b"\r\n\r\n"
    )


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64], ids=lambda n: f"in {n}-byte chunks")
async def test_an_event_stream_tool_result_is_scrubbed_at_every_cut(gw: Pipeline, size: int) -> None:
    ph = placeholder(gw)
    plain, escaped = events(f"got {SECRET}"), events(json.dumps({"token": SECRET}))
    body = plain + escaped
    for offset in range(size):  # every boundary the secret can be cut at, for this chunk size
        flow = await send(gw, "mcp.test", call("create_issue", {"token": ph}))
        assert flow.response is None, "refused"
        chunks = [body[:offset], *(body[i : i + size] for i in range(offset, len(body), size))]
        pieces = await streamed(gw, flow, [c for c in chunks if c])
        assert all(pieces), "an empty piece ends a chunked body on HTTP/1"
        out = b"".join(pieces)
        assert_no_secret(out)
        expected = events(f"got {ph}") + events(json.dumps({"token": ph}))
        assert out == expected


async def test_small_chunks_of_an_event_stream_without_secrets_pass_intact(gw: Pipeline) -> None:
    flow = await send(gw, "mcp.test", call("create_issue", {"token": placeholder(gw)}))
    body = events("nothing secret here") * 20
    pieces = await streamed(gw, flow, [body[i : i + 1] for i in range(len(body))])
    assert all(pieces), "an empty piece ends a chunked body on HTTP/1: the guest would get less"
    assert b"".join(pieces) == body
