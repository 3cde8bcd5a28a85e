"""MCP list answers filtered on the whole pipeline in process: a `tools/list` answered in JSON
or as an event stream (cut anywhere, compressed or not) reaches the agent without the tools
its policy refuses, the record names what was removed, other answers pass untouched, and an
answer that cannot be read is withheld or cut, never passed unfiltered. The credential
broker's scrubber runs behind the list filter."""

from __future__ import annotations

import gzip
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
from sandgate.proxy.addons.agent_lists import LIST_WITHHELD
from sandgate.proxy.addons.agent_protocols import ProtocolBodyRefused
from sandgate.proxy.addons.protocol_bodies import MAX_BODY

PORT = 8080
HOSTS = {"mcp.test": ["127.0.0.2"]}
MCP = f"http://mcp.test:{PORT}/mcp"
SECRET = "sk-real-0123456789abcdef0123"
TOOLS = ["search_issues", "merge_pull", "delete_repo", "push_code"]
KEPT = ["search_issues", "merge_pull"]
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


def tenant() -> str:
    rules = [
        {
            "id": "mcp",
            "hosts": ["mcp.test"],
            "ports": [PORT],
            "mcp": {"tools": {"allow": ["search_*"], "ask": ["merge_*"], "deny": ["delete_*"]}},
        }
    ]
    doc = yaml.safe_load(tenant_yaml("t1", rules))
    # A secret of the tenant's: its responses are scrubbed (the scrubber chains behind the filter).
    doc["credentials"] = [
        {
            "name": "apikey",
            "secret": "file:apikey.secret",
            "hosts": ["mcp.test"],
            "ports": [PORT],
            "plaintext": True,
            "inject": {"header": "Authorization", "format": "Bearer {secret}"},
        }
    ]
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    broker = Broker(placeholder_key=Secret(b"test-placeholder-key-0123456789abcdef"))
    yield broker
    await broker.aclose()


@pytest.fixture
def gw(tmp_path: Path, broker: Broker) -> Iterator[Pipeline]:
    files = {"tenants/apikey.secret": SECRET}
    with whole_pipeline(tmp_path, {"t1.yaml": tenant()}, HOSTS, broker=broker, files=files) as running:
        yield running


def tools_answer(rpc_id: int | str = 1, names: list[str] = TOOLS, description: str = "") -> dict[str, Any]:
    tools = [{"name": n, "description": description, "inputSchema": {"type": "object"}} for n in names]
    return {"jsonrpc": "2.0", "id": rpc_id, "result": {"tools": tools}}


async def asked(gw: Pipeline, body: object = LIST) -> http.HTTPFlow:
    """A new connection's MCP request through the request hooks; it must be allowed."""
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(
        client,
        MCP,
        method="POST",
        sandbox="sb1",
        token=TOKEN,
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
    )
    await gw.hook(HttpRequestHeadersHook(flow))
    await gw.hook(HttpRequestHook(flow))
    assert flow.response is None, "the request was refused"
    return flow


async def buffered(gw: Pipeline, flow: http.HTTPFlow, upstream: http.Response) -> http.Response:
    """The upstream's answer, read whole by mitmproxy, through the response hooks."""
    flow.response = upstream
    await gw.hook(HttpResponseHeadersHook(flow))
    assert not flow.response.stream, "a small JSON answer is read whole"
    await gw.hook(HttpResponseHook(flow))
    assert flow.response is not None
    return flow.response


async def streamed(gw: Pipeline, flow: http.HTTPFlow, upstream: http.Response, chunks: list[bytes]) -> bytes:
    """The upstream's answer streamed: its head through the hooks, its body chunk by chunk
    through the stream callable (b"" at the end, as mitmproxy does), then the response hook."""
    flow.response = upstream
    await gw.hook(HttpResponseHeadersHook(flow))
    stream = flow.response.stream
    assert callable(stream)
    out = bytearray()
    for chunk in [*chunks, b""]:
        got = stream(chunk)
        out += got if isinstance(got, bytes) else b"".join(got)
    await gw.hook(HttpResponseHook(flow))
    return bytes(out)


def names(message: Any) -> list[str]:
    return [tool["name"] for tool in message["result"]["tools"]]


def removed(gw: Pipeline) -> Any:
    (record,) = gw.records()
    return record["mcp"].get("removed")


def json_response(body: bytes, **headers: str) -> http.Response:
    """An upstream answer with `body` as its raw bytes (`make` would encode it again)."""
    response = http.Response.make(200, b"", {"Content-Type": "application/json", **headers})
    response.raw_content = body
    if "transfer-encoding" not in response.headers:
        response.headers["content-length"] = str(len(body))
    return response


async def test_a_json_tools_list_answer_loses_denied_and_not_allowed_tools_and_keeps_ask(
    gw: Pipeline,
) -> None:
    flow = await asked(gw)
    response = await buffered(gw, flow, json_response(json.dumps(tools_answer()).encode()))
    assert names(json.loads(response.content or b"")) == KEPT
    assert response.headers["content-length"] == str(len(response.raw_content or b""))
    assert removed(gw) == {"tools/list": {"count": 2, "names": ["delete_repo", "push_code"]}}


async def test_an_event_stream_answer_cut_across_chunks_is_filtered_event_by_event(gw: Pipeline) -> None:
    flow = await asked(gw)
    note = b'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{}}\r\n\r\n'
    answer = b"event: message\r\nid: e1\r\ndata: " + json.dumps(tools_answer()).encode() + b"\r\n\r\n"
    body = b"id: e0\r\ndata:\r\n\r\n" + note + answer
    chunks = [body[i : i + 7] for i in range(0, len(body), 7)]
    upstream = http.Response.make(200, b"", {"Content-Type": "text/event-stream"})
    out = await streamed(gw, flow, upstream, chunks)
    assert out.startswith(b"id: e0\r\ndata:\r\n\r\n" + note), "other events go byte for byte"
    event = out[len(b"id: e0\r\ndata:\r\n\r\n" + note) :]
    assert event.startswith(b"event: message\r\nid: e1\r\ndata: ") and event.endswith(b"\r\n\r\n")
    assert names(json.loads(event.split(b"data: ", 1)[1])) == KEPT
    assert flow.response is not None and "content-length" not in flow.response.headers
    assert removed(gw)["tools/list"]["names"] == ["delete_repo", "push_code"]


async def test_the_scrubber_runs_behind_the_list_filter(gw: Pipeline) -> None:
    flow = await asked(gw)
    answer = json.dumps(tools_answer(description=f"echo {SECRET}")).encode()
    upstream = http.Response.make(200, b"", {"Content-Type": "text/event-stream"})
    out = await streamed(gw, flow, upstream, [b"data: " + answer[:40], answer[40:] + b"\n\n"])
    assert SECRET.encode() not in out
    assert names(json.loads(out.removeprefix(b"data: "))) == KEPT


async def test_an_answer_to_a_call_that_is_not_a_list_call_is_untouched(gw: Pipeline) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search_issues"}}
    flow = await asked(gw, call)
    body = json.dumps(tools_answer()).encode()  # a result that looks like a list: not one here
    response = await buffered(gw, flow, json_response(body))
    assert response.raw_content == body
    assert removed(gw) is None


async def test_a_list_answer_with_nothing_to_remove_is_sent_as_it_came(gw: Pipeline) -> None:
    flow = await asked(gw)
    body = json.dumps(tools_answer(names=KEPT), indent=1).encode()
    assert (await buffered(gw, flow, json_response(body))).raw_content == body


async def test_a_compressed_json_answer_is_filtered_and_sent_uncompressed(gw: Pipeline) -> None:
    flow = await asked(gw)
    body = gzip.compress(json.dumps(tools_answer()).encode())
    response = await buffered(gw, flow, json_response(body, **{"Content-Encoding": "gzip"}))
    assert "content-encoding" not in response.headers
    assert names(json.loads(response.raw_content or b"")) == KEPT
    assert response.headers["content-length"] == str(len(response.raw_content or b""))


async def test_a_compressed_event_stream_is_decoded_filtered_and_sent_uncompressed(gw: Pipeline) -> None:
    flow = await asked(gw)
    body = gzip.compress(b"data: " + json.dumps(tools_answer()).encode() + b"\n\n")
    upstream = http.Response.make(200, b"", {"Content-Type": "text/event-stream", "Content-Encoding": "gzip"})
    out = await streamed(gw, flow, upstream, [body[:20], body[20:]])
    assert flow.response is not None and "content-encoding" not in flow.response.headers
    assert names(json.loads(out.removeprefix(b"data: "))) == KEPT


async def test_a_json_answer_of_unknown_length_is_held_then_sent_filtered(gw: Pipeline) -> None:
    flow = await asked(gw)
    body = json.dumps(tools_answer()).encode()
    upstream = json_response(b"", **{"Transfer-Encoding": "chunked"})
    upstream.headers.pop("content-length", None)
    out = await streamed(gw, flow, upstream, [body[:30], body[30:]])
    assert names(json.loads(out)) == KEPT


async def test_an_unreadable_json_answer_is_withheld_as_a_json_rpc_error(gw: Pipeline) -> None:
    flow = await asked(gw)
    body = b'{"jsonrpc":"2.0","id":1,"result":{"tools":[]},"result":{"tools":[{"name":"delete_repo"}]}}'
    response = await buffered(gw, flow, json_response(body))
    answer = json.loads(response.content or b"")
    assert (response.status_code, answer["id"]) == (200, 1)
    assert answer["error"]["data"]["reason"] == "upstream_protocol_error"
    assert b"delete_repo" not in (response.raw_content or b"")
    (record,) = gw.records()
    assert record["error"] == LIST_WITHHELD


async def test_an_event_stream_it_cannot_read_is_cut(gw: Pipeline) -> None:
    flow = await asked(gw)
    upstream = http.Response.make(200, b"", {"Content-Type": "text/event-stream"})
    flow.response = upstream
    await gw.hook(HttpResponseHeadersHook(flow))
    stream = flow.response.stream
    assert callable(stream)
    # The scrubber chained behind the filter is a generator: mitmproxy drains it, and so do we.
    with pytest.raises(ProtocolBodyRefused):
        list(stream(b"data: " + b"x" * (MAX_BODY + 1)))
