"""The hostile inputs of issue 26 on the whole pipeline in process: every one is refused in the
guest's protocol (a JSON-RPC error naming the reason, or GraphQL `errors`), nothing of it
reaches the upstream, and the exchange has exactly one audit record carrying the reason.

Each MCP body is sent twice: with a Content-Length (read whole, decided in the request hook)
and chunked (held back in the body stream, decided at its end). Inputs the end-to-end tests
already drive through a real gateway (a WebSocket message split across fragments, a GraphQL
mutation behind an alias or in a second operation, an unlisted persisted-query id) are not
repeated here.

"An SSE-borne server request" is a server→client JSON-RPC request (`sampling/createMessage`,
`elicitation/create`) in an answer's event stream. The agent's answer to it comes back as a
POST the gateway decides: a response asks for nothing and goes on, but it cannot carry a
`tools/call` beside it. A server request inside a list answer passes as it came, and does
not stop the list answer from being filtered."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import urllib.parse
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import brotli
import pytest
from conftest import TOKEN, tenant_yaml
from mitmproxy import flow as mflow
from mitmproxy import http
from mitmproxy.proxy.layers.http._hooks import (
    HttpErrorHook,
    HttpRequestHeadersHook,
    HttpRequestHook,
    HttpResponseHeadersHook,
    HttpResponseHook,
)
from mitmproxy.test import tflow
from support.inprocess import proxy_flow
from support.whole_pipeline import Pipeline, whole_pipeline

from sandgate.proxy.addons.agent_protocols import ProtocolBodyRefused

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

PORT = 8080
HOSTS = {"mcp.test": ["127.0.0.2"], "rpc.test": ["127.0.0.3"], "gql.test": ["127.0.0.4"]}
MCP = f"http://mcp.test:{PORT}/mcp"
RPC = f"http://rpc.test:{PORT}/rpc"
GQL = f"http://gql.test:{PORT}/graphql"
UPSTREAM_ANSWER = b'{"jsonrpc":"2.0","id":1,"result":{}}'
# JSON-RPC 2.0's codes as the gateway answers them.
PARSE_ERROR, INVALID_REQUEST, DENIED = -32700, -32600, -32001

VIEWER = "query Viewer { viewer { login } }"
DELETE = 'mutation Delete { deleteRepository(name: "api") }'


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def tenant() -> str:
    rules = [
        {
            "id": "mcp",
            "hosts": ["mcp.test"],
            "ports": [PORT],
            "mcp": {"tools": {"allow": ["search_*", "create_issue"], "deny": ["delete_*"]}},
        },
        {
            "id": "rpc",
            "hosts": ["rpc.test"],
            "ports": [PORT],
            "jsonrpc": {"methods": {"allow": ["eth_*"], "deny": ["eth_sendTransaction"]}},
        },
        {
            "id": "gql",
            "hosts": ["gql.test"],
            "ports": [PORT],
            "graphql": {"persisted_queries": [_sha(VIEWER)]},
        },
    ]
    return tenant_yaml("t1", rules)


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Pipeline]:
    with whole_pipeline(tmp_path, {"t1.yaml": tenant()}, HOSTS) as running:
        yield running


def call(tool: str, rpc_id: int | str | None = 1, arguments: Any = None) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {} if arguments is None else arguments},
    }


def raw(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


@dataclass
class Sent:
    """What became of one request: the flow, and the body bytes that reached the upstream
    (None: the request never went upstream at all)."""

    flow: http.HTTPFlow
    upstream: bytes | None


async def send(
    gw: Pipeline,
    url: str,
    body: bytes = b"",
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    chunked: bool = False,
) -> Sent:
    """One proxy request through the request hooks (its body read whole, or chunked through
    the body stream as mitmproxy feeds it), then, when not answered, an upstream 200."""
    client = tflow.tclient_conn()
    await gw.connect(client)
    given = {"Content-Type": "application/json"} if headers is None else headers
    flow = proxy_flow(client, url, method=method, sandbox="sb1", token=TOKEN, content=body, headers=given)
    if not given.get("Content-Type"):
        flow.request.headers.pop("Content-Type", None)
    if chunked:
        del flow.request.headers["content-length"]
        flow.request.headers["Transfer-Encoding"] = "chunked"
    await gw.hook(HttpRequestHeadersHook(flow))
    upstream: bytes | None = None
    if chunked and flow.response is None:
        stream = flow.request.stream
        assert callable(stream), "a chunked body governed by a protocol rule is streamed"
        upstream = b""
        try:
            for chunk in (body[:7], body[7:], b""):
                out = stream(chunk)
                upstream += out if isinstance(out, bytes) else b"".join(out)
        except Exception:
            assert flow.response is not None, "a body stream was cut without an answer"
    elif flow.response is None:
        await gw.hook(HttpRequestHook(flow))
        if flow.response is None:
            upstream = flow.request.raw_content or b""
    if flow.response is None:
        flow.response = http.Response.make(200, UPSTREAM_ANSWER, {"Content-Type": "application/json"})
        await gw.hook(HttpResponseHeadersHook(flow))
    await gw.hook(HttpResponseHook(flow))
    return Sent(flow, upstream)


def refused(sent: Sent, reason: str) -> Any:
    """The gateway's own answer (HTTP 200, JSON, naming `reason`), once nothing went upstream."""
    assert not sent.upstream, f"forwarded upstream: {sent.upstream!r}"
    response = sent.flow.response
    assert response is not None and response.status_code == 200
    assert response.headers.get("X-Sandgate-Reason") == reason
    assert response.headers["Content-Type"] == "application/json"
    return json.loads(response.content or b"")


def one_record(gw: Pipeline, reason: str, protocol: str = "mcp") -> dict[str, Any]:
    """The exchange's only record: a denial for `reason`, its protocol object saying so too."""
    (record,) = gw.records()
    assert (record["decision"], record["reason"], record["status"]) == ("deny", reason, 200)
    assert (record[protocol]["verdict"], record[protocol]["reason"]) == ("deny", reason)
    return record


@dataclass(frozen=True)
class Hostile:
    """One hostile MCP body and how it must be refused: the reason, the record's `problem`,
    the JSON-RPC error's code and id."""

    body: bytes
    reason: str
    problem: str | None = None
    code: int = DENIED
    rpc_id: int | str | None = 1
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


def _invalid(body: bytes, problem: str, *, parse: bool = False, rpc_id: int | None = None) -> Hostile:
    return Hostile(body, "invalid_request", problem, PARSE_ERROR if parse else INVALID_REQUEST, rpc_id)


SEARCH = raw(call("search_issues"))
DENIED_CALL = raw(call("delete_repo"))
# The call's object, its params and its arguments are three levels: 61 more reach the limit, 64.
DEEP_ARGUMENTS = SEARCH.replace(b'"arguments": {}', b'"arguments": {"a": ' + b"[" * 61 + b"]" * 61 + b"}")

HOSTILE: dict[str, Hostile] = {
    # Tool names: case, confusables, spaces, NUL.
    "a denied tool in upper case is denied": Hostile(raw(call("DELETE_REPO")), "tool_denied"),
    "a denied tool in mixed case is denied": Hostile(raw(call("Delete_Repo")), "tool_denied"),
    "an allowed tool in another case than its allow glob is not allowed": Hostile(
        raw(call("Search_issues")), "tool_not_allowed"
    ),
    "a denied tool with a Cyrillic е is not canonical": _invalid(
        raw(call("d\u0435lete_repo")), "bad_tool_name", rpc_id=1
    ),
    "an allowed tool with a Cyrillic е does not match its ASCII glob": _invalid(
        raw(call("s\u0435arch_issues")), "bad_tool_name", rpc_id=1
    ),
    "an allowed tool with a Cyrillic е escaped as \\u0435 is not canonical": _invalid(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"s\\u0435arch_issues"}}',
        "bad_tool_name",
        rpc_id=1,
    ),
    "a denied tool with a fullwidth letter is not canonical": _invalid(
        raw(call("\uff44elete_repo")), "tool_name_not_canonical", rpc_id=1
    ),
    "an allowed tool with a fullwidth letter does not match its ASCII glob": _invalid(
        raw(call("\uff53earch_issues")), "tool_name_not_canonical", rpc_id=1
    ),
    "a denied tool with a zero-width space is not canonical": _invalid(
        raw(call("delete\u200b_repo")), "bad_tool_name", rpc_id=1
    ),
    "a denied tool with a trailing space is not canonical": _invalid(
        raw(call("delete_repo ")), "bad_tool_name", rpc_id=1
    ),
    "an allowed tool with a trailing space is not canonical": _invalid(
        raw(call("search_issues ")), "bad_tool_name", rpc_id=1
    ),
    "an allowed tool with a leading tab is not canonical": _invalid(
        raw(call("\tsearch_issues")), "bad_tool_name", rpc_id=1
    ),
    "an allowed tool ending in NUL is not canonical": _invalid(
        raw(call("search_issues\x00")), "bad_tool_name", rpc_id=1
    ),
    "an allowed tool then NUL then a denied one is not canonical": _invalid(
        raw(call("search_issues\x00delete_repo")), "bad_tool_name", rpc_id=1
    ),
    # The JSON itself: what two readers could read differently.
    "the tool name twice, allowed then denied, is a parse error": _invalid(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_x","name":"delete_repo"}}',
        "duplicate_key",
        parse=True,
    ),
    "the tool name twice, denied then allowed, is a parse error": _invalid(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delete_repo","name":"search_x"}}',
        "duplicate_key",
        parse=True,
    ),
    "the method twice, ping then tools/call, is a parse error": _invalid(
        b'{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call","params":{"name":"delete_repo"}}',
        "duplicate_key",
        parse=True,
    ),
    "params twice is a parse error": _invalid(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_x"},'
        b'"params":{"name":"delete_repo"}}',
        "duplicate_key",
        parse=True,
    ),
    "a block comment is a parse error": _invalid(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call",/* search_x */"params":{"name":"delete_repo"}}',
        "not_json",
        parse=True,
    ),
    "a line comment is a parse error": _invalid(SEARCH[:-1] + b"// x\n}", "not_json", parse=True),
    "NaN in the arguments is a parse error": _invalid(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_x","arguments":{"n":NaN}}}',
        "not_finite",
        parse=True,
    ),
    "-Infinity in the arguments is a parse error": _invalid(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_x","arguments":{"n":-Infinity}}}',
        "not_finite",
        parse=True,
    ),
    "a number too large for a float is a parse error": _invalid(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_x","arguments":{"n":1e400}}}',
        "not_finite",
        parse=True,
    ),
    "a UTF-8 BOM before an allowed call is a parse error": _invalid(
        b"\xef\xbb\xbf" + SEARCH, "bom", parse=True
    ),
    "a UTF-16 body is a parse error": _invalid(SEARCH.decode().encode("utf-16"), "invalid_utf8", parse=True),
    "a second JSON value after an allowed call is a parse error": _invalid(
        SEARCH + DENIED_CALL, "not_json", parse=True
    ),
    "a half surrogate escape in the tool name is a parse error": _invalid(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_\\ud800"}}',
        "unpaired_surrogate",
        parse=True,
    ),
    # Batches whose ids collide: which answer would be whose?
    "two calls of a batch with the same id are refused": _invalid(
        raw([call("search_issues", 1), call("search_code", 1)]), "duplicate_id"
    ),
    "ids 1 and '1' in one batch collide": _invalid(
        raw([call("search_issues", 1), call("delete_repo", "1")]), "duplicate_id"
    ),
    "a batch nested in a batch is not JSON-RPC": _invalid(raw([[call("delete_repo")]]), "not_jsonrpc"),
    "a null id on a call is refused": _invalid(raw(call("delete_repo", None)), "bad_id"),
    "a float id is refused": _invalid(
        b'{"jsonrpc":"2.0","id":1.0,"method":"tools/call","params":{"name":"delete_repo"}}', "bad_id"
    ),
    # params and arguments in shapes MCP does not have.
    "params as an array naming a denied tool is refused": _invalid(
        raw({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ["delete_repo", {}]}),
        "bad_params",
        rpc_id=1,
    ),
    "params as an array on an allowed method is refused": _invalid(
        raw({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": []}), "bad_params", rpc_id=1
    ),
    "params as a string is refused": _invalid(
        raw({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": "delete_repo"}), "bad_params"
    ),
    "arguments as an array are refused": _invalid(
        raw(call("search_issues", 1, ["delete_repo"])), "bad_arguments", rpc_id=1
    ),
    "a tool name that is not a string is refused": _invalid(
        raw({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": ["delete_repo"]}}),
        "bad_tool_name",
        rpc_id=1,
    ),
    "arguments nested one level past the depth limit are refused": _invalid(
        DEEP_ARGUMENTS.replace(b"[", b"[[", 1).replace(b"]", b"]]", 1), "too_deep", parse=True
    ),
    # The body's labels do not choose whether it is read.
    "a denied call as text/plain is denied": Hostile(
        DENIED_CALL, "tool_denied", headers={"Content-Type": "text/plain"}
    ),
    "a denied call with no Content-Type is denied": Hostile(DENIED_CALL, "tool_denied", headers={}),
    "a denied call as a form is denied": Hostile(
        DENIED_CALL, "tool_denied", headers={"Content-Type": "application/x-www-form-urlencoded"}
    ),
    "a denied call as application/octet-stream is denied": Hostile(
        DENIED_CALL, "tool_denied", headers={"Content-Type": "application/octet-stream"}
    ),
    # Compressed bodies are decided decoded.
    "a denied call in gzip is denied": Hostile(
        gzip.compress(DENIED_CALL), "tool_denied", headers={"Content-Encoding": "gzip"}
    ),
    "a denied call in deflate is denied": Hostile(
        zlib.compress(DENIED_CALL), "tool_denied", headers={"Content-Encoding": "deflate"}
    ),
    "a denied call in brotli is denied": Hostile(
        brotli.compress(DENIED_CALL), "tool_denied", headers={"Content-Encoding": "br"}
    ),
    "a denied call in zstd is denied": Hostile(
        zstd.compress(DENIED_CALL), "tool_denied", headers={"Content-Encoding": "zstd"}
    ),
    "a denied call in gzip named in upper case is denied": Hostile(
        gzip.compress(DENIED_CALL), "tool_denied", headers={"Content-Encoding": " GZIP "}
    ),
    "a denied call in gzip labelled text/plain is denied": Hostile(
        gzip.compress(DENIED_CALL),
        "tool_denied",
        headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"},
    ),
    "an allowed call gzipped twice, labelled gzip once, is a parse error": Hostile(
        gzip.compress(gzip.compress(SEARCH)),
        "invalid_request",
        "invalid_utf8",
        PARSE_ERROR,
        None,
        {"Content-Encoding": "gzip"},
    ),
    "an allowed call gzipped twice and labelled so is unreadable": Hostile(
        gzip.compress(gzip.compress(SEARCH)),
        "invalid_request",
        None,
        INVALID_REQUEST,
        None,
        {"Content-Encoding": "gzip, gzip"},
    ),
    "a denied call as a raw deflate stream (no zlib header) is denied": Hostile(
        zlib.compress(DENIED_CALL)[2:-4], "tool_denied", headers={"Content-Encoding": "deflate"}
    ),
}


@pytest.mark.parametrize("chunked", [False, True], ids=["with a Content-Length", "chunked"])
@pytest.mark.parametrize("case", list(HOSTILE.values()), ids=list(HOSTILE))
async def test_a_hostile_mcp_body_is_refused_never_forwarded_and_recorded_once(
    gw: Pipeline, case: Hostile, chunked: bool
) -> None:
    sent = await send(gw, MCP, case.body, headers=case.headers, chunked=chunked)
    answer = refused(sent, case.reason)
    assert isinstance(answer, dict), answer
    assert (answer["id"], answer["error"]["code"]) == (case.rpc_id, case.code)
    assert answer["error"]["data"]["reason"] == case.reason
    record = one_record(gw, case.reason)
    assert record["mcp"].get("problem") == case.problem


@pytest.mark.parametrize("chunked", [False, True], ids=["with a Content-Length", "chunked"])
async def test_arguments_nested_to_the_depth_limit_itself_go_on(gw: Pipeline, chunked: bool) -> None:
    """The depth case above is one level past what passes: the bound is where it is written."""
    sent = await send(gw, MCP, DEEP_ARGUMENTS, chunked=chunked)
    assert sent.upstream == DEEP_ARGUMENTS
    (record,) = gw.records()
    assert record["decision"] == "allow"


BATCHES: dict[str, tuple[list[Any], str, list[tuple[Any, str]]]] = {
    "an allowed and a denied call": (
        [call("search_issues", 1), call("delete_repo", 2)],
        "tool_denied",
        [(1, "batch_refused"), (2, "tool_denied")],
    ),
    "a denied call in upper case after ten allowed ones": (
        [call("search_issues", i) for i in range(10)] + [call("DELETE_repo", 10)],
        "tool_denied",
        [(i, "batch_refused") for i in range(10)] + [(10, "tool_denied")],
    ),
    "a denied call beside a notification and an initialize": (
        [
            {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            call("delete_repo", "x"),
        ],
        "tool_denied",
        [("init", "batch_refused"), ("x", "tool_denied")],
    ),
    "a call no glob allows beside an allowed one": (
        [call("create_issue", 1), call("push_code", 2)],
        "tool_not_allowed",
        [(1, "batch_refused"), (2, "tool_not_allowed")],
    ),
}


@pytest.mark.parametrize("chunked", [False, True], ids=["with a Content-Length", "chunked"])
@pytest.mark.parametrize(("batch", "reason", "answers"), list(BATCHES.values()), ids=list(BATCHES))
async def test_a_batch_smuggling_a_refused_call_is_refused_whole(
    gw: Pipeline, batch: list[Any], reason: str, answers: list[tuple[Any, str]], chunked: bool
) -> None:
    answer = refused(await send(gw, MCP, raw(batch), chunked=chunked), reason)
    assert [(a["id"], a["error"]["data"]["reason"]) for a in answer] == answers
    record = one_record(gw, reason)
    assert record["mcp"]["batch"] == len(batch)


def _query(**params: str) -> str:
    return urllib.parse.urlencode(params)


GETS: dict[str, tuple[str, str]] = {
    "a denied MCP call in the query string": (
        MCP,
        _query(jsonrpc="2.0", id="1", method="tools/call", params=json.dumps({"name": "delete_repo"})),
    ),
    "an allowed MCP call in the query string": (
        MCP,
        _query(jsonrpc="2.0", id="1", method="tools/call", params=json.dumps({"name": "search_issues"})),
    ),
    "a method named in upper case in the query string": (MCP, _query(METHOD="tools/call")),
    "a method named percent-encoded in the query string": (MCP, "%6Dethod=tools%2Fcall&name=delete_repo"),
    "a method named after a space in the query string": (MCP, "%20method=tools%2Fcall"),
    "params alone in the query string": (MCP, _query(params=json.dumps({"name": "delete_repo"}))),
    "a method after a semicolon in the query string": (RPC, "x=1;method=eth_sendTransaction"),
    "a method named as an array in the query string": (RPC, "method%5B%5D=eth_sendTransaction"),
    "a method named with a NUL in the query string": (RPC, "method%00=eth_sendTransaction"),
    "a denied JSON-RPC method in the query string": (RPC, _query(method="eth_sendTransaction", params="[]")),
    "an allowed JSON-RPC method in the query string": (RPC, _query(method="eth_call", params="[]", id="1")),
}


@pytest.mark.parametrize(("url", "query"), list(GETS.values()), ids=list(GETS))
async def test_a_call_sent_as_a_get_with_query_parameters_is_invalid_request(
    gw: Pipeline, url: str, query: str
) -> None:
    answer = refused(await send(gw, f"{url}?{query}", method="GET", headers={}), "invalid_request")
    assert (answer["id"], answer["error"]["code"]) == (None, INVALID_REQUEST)
    assert "query string" in answer["error"]["data"]["detail"]
    one_record(gw, "invalid_request", "mcp" if url == MCP else "jsonrpc")


@pytest.mark.parametrize("method", ["GET", "DELETE", "OPTIONS"])
async def test_a_denied_call_in_the_body_of_a_bodiless_method_is_denied(gw: Pipeline, method: str) -> None:
    answer = refused(await send(gw, MCP, DENIED_CALL, method=method), "tool_denied")
    assert answer["id"] == 1
    one_record(gw, "tool_denied")


@pytest.mark.parametrize(
    ("body", "reason", "answers"),
    [
        (
            raw({"jsonrpc": "2.0", "id": 2, "method": "eth_sendTransaction", "params": [{"to": "0x0"}]}),
            "rpc_method_not_allowed",
            2,
        ),
        (
            raw({"jsonrpc": "2.0", "id": 2, "method": "ETH_SENDTRANSACTION", "params": []}),
            "rpc_method_not_allowed",
            2,
        ),
        (
            raw(
                [
                    {"jsonrpc": "2.0", "id": 1, "method": "eth_call"},
                    {"jsonrpc": "2.0", "id": 2, "method": "admin_peers"},
                ]
            ),
            "rpc_method_not_allowed",
            [(1, "batch_refused"), (2, "rpc_method_not_allowed")],
        ),
        (
            b'{"jsonrpc":"2.0","id":2,"method":"eth_call","method":"eth_sendTransaction"}',
            "invalid_request",
            None,
        ),
        (
            raw(
                [
                    {"jsonrpc": "2.0", "id": 1, "method": "eth_call"},
                    {"jsonrpc": "2.0", "id": "1", "method": "eth_x"},
                ]
            ),
            "invalid_request",
            None,
        ),
    ],
    ids=[
        "a denied method is denied",
        "a denied method in upper case is denied",
        "a batch smuggling a method no glob allows is refused whole",
        "the method given twice is a parse error",
        "ids that collide in a batch are refused",
    ],
)
async def test_a_hostile_jsonrpc_body_is_refused_never_forwarded_and_recorded_once(
    gw: Pipeline, body: bytes, reason: str, answers: Any
) -> None:
    answer = refused(await send(gw, RPC, body, headers={"Content-Type": "text/plain"}), reason)
    if isinstance(answers, list):
        assert [(a["id"], a["error"]["data"]["reason"]) for a in answer] == answers
    else:
        assert (answer["id"], answer["error"]["data"]["reason"]) == (answers, reason)
    one_record(gw, reason, "jsonrpc")


# --- A server's requests, carried in an event stream, and the agent's answers to them --------

SAMPLING: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": "srv-1",
    "method": "sampling/createMessage",
    "params": {"messages": [], "maxTokens": 10},
}
SAMPLED = {"jsonrpc": "2.0", "id": "srv-1", "result": {"role": "assistant", "content": {"type": "text"}}}


async def test_the_agents_answer_to_a_server_request_goes_on_as_a_response(gw: Pipeline) -> None:
    sent = await send(gw, MCP, raw(SAMPLED))
    assert sent.upstream == raw(SAMPLED)
    (record,) = gw.records()
    assert record["decision"] == "allow"
    assert record["mcp"]["messages"] == [
        {
            "method": None,
            "kind": "response",
            "id": "srv-1",
            "verdict": "allow",
            "reason": "allowed",
            "rule": None,
        }
    ]


SMUGGLED_IN_RESPONSES: dict[str, tuple[bytes, str, str | None, Any]] = {
    "a response that also names tools/call": (
        raw({**SAMPLED, "method": "tools/call", "params": {"name": "delete_repo"}}),
        "invalid_request",
        "not_jsonrpc",
        None,
    ),
    "an error response that also names tools/call": (
        raw(
            {
                "jsonrpc": "2.0",
                "id": "srv-1",
                "error": {"code": -1, "message": "declined"},
                "method": "tools/call",
                "params": {"name": "delete_repo"},
            }
        ),
        "invalid_request",
        "not_jsonrpc",
        None,
    ),
    "a response with a null method": (
        raw({**SAMPLED, "method": None}),
        "invalid_request",
        "bad_method",
        None,
    ),
    "a response batched with a denied call": (
        raw([SAMPLED, call("delete_repo", 2)]),
        "tool_denied",
        None,
        [("srv-1", "batch_refused"), (2, "tool_denied")],
    ),
    "a response batched with a call of the same id": (
        raw([SAMPLED, call("search_issues", "srv-1")]),
        "invalid_request",
        "duplicate_id",
        None,
    ),
    "a response with the tool name twice": (
        b'{"jsonrpc":"2.0","id":"srv-1","result":{"name":"a","name":"delete_repo"}}',
        "invalid_request",
        "duplicate_key",
        None,
    ),
}


@pytest.mark.parametrize(
    ("body", "reason", "problem", "answers"),
    list(SMUGGLED_IN_RESPONSES.values()),
    ids=list(SMUGGLED_IN_RESPONSES),
)
async def test_the_agents_answer_to_a_server_request_cannot_carry_a_tool_call(
    gw: Pipeline, body: bytes, reason: str, problem: str | None, answers: Any
) -> None:
    answer = refused(await send(gw, MCP, body), reason)
    if answers is None:
        assert (answer["id"], answer["error"]["data"]["reason"]) == (None, reason)
    else:
        assert [(a["id"], a["error"]["data"]["reason"]) for a in answer] == answers
    assert one_record(gw, reason)["mcp"].get("problem") == problem


TOOLS = ["search_issues", "delete_repo", "push_code"]


def tools_answer(rpc_id: int | str = 1) -> dict[str, Any]:
    tools = [{"name": n, "inputSchema": {"type": "object"}} for n in TOOLS]
    return {"jsonrpc": "2.0", "id": rpc_id, "result": {"tools": tools}}


def event(message: object) -> bytes:
    return b"event: message\r\ndata: " + raw(message) + b"\r\n\r\n"


async def listed(
    gw: Pipeline, response: http.Response, chunks: list[bytes], *, method: str = "POST"
) -> bytes | None:
    """A `tools/list` call (a POST; or a GET opening the older transport's event stream) that
    the gateway lets go, its answer streamed back through the hooks chunk by chunk: what the
    agent gets, or None when the gateway cut the stream (then the exchange ends in error, as
    mitmproxy ends it)."""
    client = tflow.tclient_conn()
    await gw.connect(client)
    body = raw({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}) if method == "POST" else b""
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    flow = proxy_flow(client, MCP, method=method, sandbox="sb1", token=TOKEN, content=body, headers=headers)
    await gw.hook(HttpRequestHeadersHook(flow))
    await gw.hook(HttpRequestHook(flow))
    assert flow.response is None, "the list call was refused"
    flow.response = response
    await gw.hook(HttpResponseHeadersHook(flow))
    stream = flow.response.stream
    assert callable(stream)
    out = bytearray()
    try:
        for chunk in [*chunks, b""]:
            got = stream(chunk)
            out += got if isinstance(got, bytes) else b"".join(got)
    except ProtocolBodyRefused as cut:
        flow.error = mflow.Error(str(cut))
        await gw.hook(HttpErrorHook(flow))
        return None
    await gw.hook(HttpResponseHook(flow))
    return bytes(out)


def _events(out: bytes) -> list[Any]:
    return [
        json.loads(line.removeprefix(b"data: ")) for line in out.split(b"\r\n") if line.startswith(b"data:")
    ]


SERVER_REQUESTS: dict[str, tuple[dict[str, Any], str]] = {
    "a sampling request": (SAMPLING, "POST"),
    "an elicitation request with the list call's own id": (
        {"jsonrpc": "2.0", "id": 1, "method": "elicitation/create", "params": {"message": "ok?"}},
        "POST",
    ),
    "a sampling request offering the denied tools, with the list call's id as a string": (
        {**SAMPLING, "id": "1", "params": {**SAMPLING["params"], "tools": [{"name": "delete_repo"}]}},
        "POST",
    ),
    "a server request on the older transport's event stream": (SAMPLING, "GET"),
}


@pytest.mark.parametrize(("request_", "method"), list(SERVER_REQUESTS.values()), ids=list(SERVER_REQUESTS))
async def test_a_server_request_in_a_list_answers_stream_passes_and_the_list_is_still_filtered(
    gw: Pipeline, request_: dict[str, Any], method: str
) -> None:
    body = event(request_) + event(tools_answer())
    upstream = http.Response.make(200, b"", {"Content-Type": "text/event-stream"})
    out = await listed(gw, upstream, [body[i : i + 11] for i in range(0, len(body), 11)], method=method)
    assert out is not None, "the stream was cut"
    assert out.startswith(event(request_)), "the server's request goes byte for byte"
    _, answer = _events(out)
    assert [t["name"] for t in answer["result"]["tools"]] == ["search_issues"]
    (record,) = gw.records()
    assert record["decision"] == "allow"
    assert record["mcp"]["removed"] == {"tools/list": {"count": 2, "names": ["delete_repo", "push_code"]}}


WITHHELD: dict[str, bytes] = {
    "a list answer disguised as a server request": event(
        {"jsonrpc": "2.0", "id": 1, "method": "elicitation/create", "result": tools_answer()["result"]}
    ),
    "a server request and the list answer with one id in one batch": event(
        [{"jsonrpc": "2.0", "id": 1, "method": "elicitation/create", "params": {}}, tools_answer()]
    ),
    "a list answer with its result given twice": b'data: {"jsonrpc":"2.0","id":1,"result":{"tools":[]},'
    b'"result":' + raw(tools_answer()["result"]) + b"}\n\n",
}


@pytest.mark.parametrize("body", list(WITHHELD.values()), ids=list(WITHHELD))
async def test_a_list_answer_the_filter_cannot_read_is_cut_never_passed(gw: Pipeline, body: bytes) -> None:
    upstream = http.Response.make(200, b"", {"Content-Type": "text/event-stream"})
    assert await listed(gw, upstream, [body]) is None
    (record,) = gw.records()
    assert record["error"] == "list answer withheld: it could not be filtered"


async def test_a_json_list_answer_batched_with_a_server_request_is_filtered(gw: Pipeline) -> None:
    body = raw([SAMPLING, tools_answer()])
    upstream = http.Response.make(
        200, b"", {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    )
    upstream.headers.pop("content-length", None)
    out = await listed(gw, upstream, [body[:25], body[25:]])
    assert out is not None, "the answer was withheld"
    request_, answer = json.loads(out)
    assert request_ == SAMPLING
    assert [t["name"] for t in answer["result"]["tools"]] == ["search_issues"]
    (record,) = gw.records()
    assert record["mcp"]["removed"]["tools/list"]["names"] == ["delete_repo", "push_code"]


# --- GraphQL: a persisted-query id beside a text that is not its query ------------------------


def _persisted(digest: str) -> dict[str, Any]:
    return {"extensions": {"persistedQuery": {"version": 1, "sha256Hash": digest}}}


GRAPHQL: dict[str, tuple[Any, str, str | None]] = {
    "a listed persisted-query id sent with a mutation's text": (
        {"query": DELETE, **_persisted(_sha(VIEWER))},
        "invalid_request",
        "persisted_hash_mismatch",
    ),
    "a listed persisted-query id in upper case": (
        _persisted(_sha(VIEWER).upper()),
        "invalid_request",
        "graphql_syntax",
    ),
    "an unlisted persisted-query id in a batch beside a listed one": (
        [_persisted(_sha(VIEWER)), _persisted(_sha(DELETE))],
        "persisted_query_unknown",
        None,
    ),
    "a mutation named by a listed persisted-query id's operationName": (
        {"query": f"{VIEWER} {DELETE}", "operationName": "Viewer", **_persisted(_sha(f"{VIEWER} {DELETE}"))},
        "operation_not_allowed",
        None,
    ),
    "the query given twice, the query then the mutation": (
        b'{"query":"' + VIEWER.encode() + b'","query":"' + DELETE.replace('"', '\\"').encode() + b'"}',
        "invalid_request",
        "duplicate_key",
    ),
}


@pytest.mark.parametrize(("body", "reason", "problem"), list(GRAPHQL.values()), ids=list(GRAPHQL))
async def test_a_hostile_graphql_body_is_a_graphql_error_never_forwarded_and_recorded_once(
    gw: Pipeline, body: Any, reason: str, problem: str | None
) -> None:
    answer = refused(await send(gw, GQL, body if isinstance(body, bytes) else raw(body)), reason)
    errors = [a["errors"][0] for a in answer] if isinstance(answer, list) else answer["errors"]
    assert reason in [e["extensions"]["reason"] for e in errors]
    assert all("data" not in a for a in (answer if isinstance(answer, list) else [answer]))
    assert one_record(gw, reason, "graphql")["graphql"].get("problem") == problem
