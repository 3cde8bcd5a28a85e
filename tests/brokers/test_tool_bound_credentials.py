"""Credentials bound to MCP tools: a `tools:` body credential's placeholder is replaced only
inside `params.arguments` of a `tools/call` of a tool it names, in a body read as MCP, on its
bound host; anywhere else it is refused (`credential_host_mismatch`), never replaced."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandgate.brokers import (
    Broker,
    BrokerAllow,
    BrokerDenial,
    BrokerRequest,
    DenialCause,
    PlaceholderMinter,
    SecretRegistry,
    TenantCredentials,
    apply_mutations,
)
from sandgate.brokers.tool_arguments import tool_arguments
from sandgate.policy.errors import PolicyLoadError
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.protocols.mcp import McpBody, parse_mcp
from sandgate.policy.reasons import Reason

from .conftest import KEY, MemorySource, credential, make_broker, request

# A quote, a backslash, a slash and a non-ASCII letter: it must go in JSON-escaped.
GH_SECRET = 'ghp_REAL"quote\\slash/é-0123456789'
PLAIN_SECRET = "plain-body-secret-0123456789"
HOST = "mcp.example.com"
MINTER = PlaceholderMinter(KEY)
GH = MINTER.mint("t1", "sb1", "gh")
PLAIN = MINTER.mint("t1", "sb1", "plain")


@pytest.fixture
def memory() -> MemorySource:
    return MemorySource(gh=GH_SECRET, plain=PLAIN_SECRET)


@pytest.fixture
def broker(registry: SecretRegistry) -> Broker:
    creds = (
        credential(
            name="gh",
            secret="mem:gh",
            hosts=[HOST],
            inject={"body": True},
            tools=["create_issue", "search_*"],
        ),
        credential(name="plain", secret="mem:plain", hosts=[HOST], inject={"body": True}),
    )
    return make_broker(registry, [TenantCredentials("t1", ("sb1",), creds)])


def call(tool: str, arguments: Any, rpc_id: Any = 1, **params: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, **params},
    }


def mcp_request(
    body: bytes | Any,
    *,
    host: str = HOST,
    read: McpBody | bool | None = True,
    headers: tuple[tuple[str, str], ...] = (("content-type", "application/json"),),
) -> BrokerRequest:
    """A request whose body the gateway read as MCP (`read` True: parsed from this very body)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    base = request(host, "/mcp", headers=headers, body=raw)
    mcp = parse_mcp(raw) if read is True else read or None
    return BrokerRequest(**{**{f: getattr(base, f) for f in base.__slots__}, "mcp": mcp})


def swapped(value: Any) -> Any:
    """`value` with the placeholder (any case) replaced by the secret in every string."""
    if isinstance(value, str):
        return value.replace(GH, GH_SECRET).replace(GH.upper(), GH_SECRET)
    if isinstance(value, list):
        return [swapped(v) for v in value]
    if isinstance(value, dict):
        return {k: swapped(v) for k, v in value.items()}
    return value


def forwarded(outcome: Any, req: BrokerRequest) -> bytes:
    assert isinstance(outcome, BrokerAllow), outcome
    body = apply_mutations(req, outcome.mutations).body
    assert body is not None
    return body


@pytest.mark.parametrize(
    ("body", "tools"),
    [
        (call("create_issue", {"token": GH}), [("gh", "create_issue")]),
        (call("search_code", {"auth": {"headers": [f"Bearer {GH}"]}}), [("gh", "search_code")]),
        (
            [call("create_issue", {"token": GH}, 1), call("search_x", {"q": GH}, 2)],
            [("gh", "create_issue"), ("gh", "search_x")],
        ),
        (call("create_issue", {"token": GH.upper()}), [("gh", "create_issue")]),
    ],
    ids=[
        "in the arguments of a bound tool it is replaced",
        "deep inside the arguments of a globbed tool it is replaced",
        "in every call of a batch to bound tools it is replaced",
        "in upper case it is still this sandbox's and is replaced",
    ],
)
async def test_a_placeholder_in_a_bound_tools_arguments_becomes_the_secret(
    broker: Broker, body: Any, tools: list[tuple[str, str]]
) -> None:
    req = mcp_request(body)
    outcome = await broker.plan("t1", "sb1", req)
    sent = forwarded(outcome, req)
    assert isinstance(outcome, BrokerAllow)
    assert outcome.credentials == ("gh",) and outcome.injectors == ("body",)
    assert list(outcome.tools) == tools
    assert GH.encode() not in sent.lower()
    # JSON-escaped: the body is valid JSON, the secret reads back whole, nothing else changed.
    assert json.loads(sent) == swapped(body)


async def test_the_secret_is_json_escaped_whatever_the_content_type_says(broker: Broker) -> None:
    req = mcp_request(call("create_issue", {"token": GH}), headers=(("content-type", "text/plain"),))
    sent = forwarded(await broker.plan("t1", "sb1", req), req)
    assert json.loads(sent)["params"]["arguments"]["token"] == GH_SECRET


@pytest.mark.parametrize(
    ("body", "cause", "where"),
    [
        (call("delete_repo", {"token": GH}), DenialCause.UNBOUND_TOOL, ("body:arguments",)),
        (call("Create_Issue", {"token": GH}), DenialCause.UNBOUND_TOOL, ("body:arguments",)),
        (
            [call("create_issue", {"token": GH}, 1), call("delete_repo", {"token": GH}, 2)],
            DenialCause.UNBOUND_TOOL,
            ("body:arguments",),
        ),
        (call("create_issue", {}, _meta={"token": GH}), DenialCause.MISPLACED, ("body",)),
        (call("create_issue", {"x": 1}, GH), DenialCause.MISPLACED, ("body",)),
        (
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"message": GH}},
            DenialCause.MISPLACED,
            ("body",),
        ),
        ({"jsonrpc": "2.0", "id": 3, "result": {"token": GH}}, DenialCause.MISPLACED, ("body",)),
        (
            {
                "jsonrpc": "2.0",
                "id": 4,
                "method": "prompts/get",
                "params": {"name": "p", "arguments": {"a": GH}},
            },
            DenialCause.MISPLACED,
            ("body",),
        ),
    ],
    ids=[
        "in another tool's arguments it is refused",
        "in a tool named in another case it is refused (names are case-sensitive)",
        "in a batch where one call is to another tool it is refused",
        "in params._meta, outside the arguments, it is refused",
        "as the request id it is refused",
        "in a notification it is refused",
        "in a JSON-RPC response the client sends it is refused",
        "in a prompt's arguments it is refused",
    ],
)
async def test_a_placeholder_anywhere_but_a_bound_tools_arguments_is_refused(
    broker: Broker, body: Any, cause: DenialCause, where: tuple[str, ...]
) -> None:
    outcome = await broker.plan("t1", "sb1", mcp_request(body))
    assert isinstance(outcome, BrokerDenial)
    assert (outcome.cause, outcome.reason) == (cause, Reason.CREDENTIAL_HOST_MISMATCH)
    assert outcome.credentials == ("gh",) and outcome.where == where
    if cause is DenialCause.UNBOUND_TOOL:
        assert outcome.tools[0][0] == "gh" and outcome.tools[0][1] in ("delete_repo", "Create_Issue")


async def test_a_body_not_read_as_mcp_is_refused(broker: Broker) -> None:
    outcome = await broker.plan("t1", "sb1", mcp_request(call("create_issue", {"token": GH}), read=None))
    assert isinstance(outcome, BrokerDenial) and outcome.cause is DenialCause.MISPLACED


async def test_a_graphql_variable_is_no_tool_argument(broker: Broker) -> None:
    body = {"query": "mutation($t: String!) { login(token: $t) { ok } }", "variables": {"t": GH}}
    outcome = await broker.plan("t1", "sb1", mcp_request(body, read=None))
    assert isinstance(outcome, BrokerDenial) and outcome.cause is DenialCause.MISPLACED


async def test_a_plain_body_credential_is_replaced_in_graphql_variables(broker: Broker) -> None:
    body = {"query": "mutation($t: String!) { login(token: $t) { ok } }", "variables": {"t": PLAIN}}
    req = mcp_request(body, read=None)
    sent = forwarded(await broker.plan("t1", "sb1", req), req)
    assert json.loads(sent)["variables"]["t"] == PLAIN_SECRET


async def test_another_host_gets_no_swap(broker: Broker) -> None:
    outcome = await broker.plan(
        "t1", "sb1", mcp_request(call("create_issue", {"token": GH}), host="evil.test")
    )
    assert isinstance(outcome, BrokerDenial)
    assert (outcome.cause, outcome.reason) == (DenialCause.UNBOUND_HOST, Reason.CREDENTIAL_HOST_MISMATCH)


async def test_a_reading_of_other_bytes_gives_no_swap(broker: Broker) -> None:
    """The strict reading must be of these very bytes: one of another body names no spans here."""
    other = parse_mcp(json.dumps(call("create_issue", {"token": "x"})).encode())
    body = json.dumps(call("create_issue", {"token": "x"}, GH)).encode()
    outcome = await broker.plan("t1", "sb1", mcp_request(body, read=other))
    assert isinstance(outcome, BrokerDenial) and outcome.cause is DenialCause.MISPLACED


async def test_a_compressed_body_gives_no_swap(broker: Broker) -> None:
    """Raw bytes that are gzip are not walked, even when they happen to hold the placeholder."""
    plain = json.dumps(call("create_issue", {"token": GH})).encode()
    raw = plain + gzip.compress(b"x")  # a stand-in: the placeholder raw, the header says gzip
    headers = (("content-type", "application/json"), ("content-encoding", "gzip"))
    outcome = await broker.plan("t1", "sb1", mcp_request(raw, read=parse_mcp(plain), headers=headers))
    assert isinstance(outcome, BrokerDenial) and outcome.cause is DenialCause.MISPLACED


@pytest.mark.parametrize(
    "escaped",
    [
        "\\u0073" + GH[1:],
        GH[:-1] + "\\u00" + format(ord(GH[-1]), "x"),
        GH[:10] + "\\u00" + format(ord(GH[10]), "X") + GH[11:],
    ],
    ids=["an escaped first letter", "an escaped last letter", "a letter inside escaped in upper-case hex"],
)
async def test_an_escaped_placeholder_is_refused_never_forwarded(broker: Broker, escaped: str) -> None:
    body = (
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_issue",'
        '"arguments":{"token":"' + escaped + '"}}}'
    ).encode()
    outcome = await broker.plan("t1", "sb1", mcp_request(body))
    assert isinstance(outcome, BrokerDenial)
    assert outcome.reason in (Reason.CREDENTIAL_HOST_MISMATCH, Reason.UNKNOWN_PLACEHOLDER)


# -- the walk itself ---------------------------------------------------------------------------


def test_the_walk_finds_each_calls_arguments_in_bytes_past_non_ascii_text() -> None:
    body = json.dumps(
        [call("search_x", {"q": "ünïcode", "t": GH}, "é"), call("b", {})],
        ensure_ascii=False,
    ).encode()
    calls = tool_arguments(body, parse_mcp(body))
    assert calls is not None and [c.tool for c in calls] == ["search_x", "b"]
    first = calls[0]
    assert json.loads(body[first.start : first.end]) == {"q": "ünïcode", "t": GH}
    start = body.index(GH.encode())
    assert first.holds(start, start + len(GH)) and not calls[1].holds(start, start + len(GH))


@pytest.mark.parametrize(
    ("raw", "read_from"),
    [
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{},"arguments":{"t":"x"}}}',
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"t":"x"}}}',
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"b","arguments":{}}}',
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{}}}',
        ),
        (
            b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{}}}]',
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{}}}',
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{}}} {}',
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{}}}',
        ),
        (b"\xff", b'{"jsonrpc":"2.0","id":1,"method":"ping"}'),
    ],
    ids=[
        "a key twice gives no spans",
        "another tool than the reading's gives no spans",
        "a batch where the reading had one message gives no spans",
        "trailing data gives no spans",
        "bytes that are not UTF-8 give no spans",
    ],
)
def test_a_walk_that_disagrees_with_the_strict_reading_gives_no_spans(raw: bytes, read_from: bytes) -> None:
    assert tool_arguments(raw, parse_mcp(read_from)) is None


def test_escaped_keys_read_as_the_strict_reader_reads_them() -> None:
    body = (
        b'{"jsonrpc":"2.0","id":1,"method":"tools\\/call","p\\u0061rams":{"n\\u0061me":"a",'
        b'"\\u0061rguments":{"t":"x"}}}'
    )
    calls = tool_arguments(body, parse_mcp(body))
    assert calls is not None and len(calls) == 1
    assert json.loads(body[calls[0].start : calls[0].end]) == {"t": "x"}


# -- the model ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"inject": {"header": "X-Key"}, "tools": ["a"]}, "only with inject body"),
        ({"inject": {"body": True}, "tools": []}, "at least 1"),
        ({"inject": {"body": True}, "tools": ["bad name"]}, "not a tool name glob"),
    ],
    ids=["tools on a header credential", "an empty tools list", "a glob with a space"],
)
def test_a_tenant_file_with_bad_tools_fails_to_load_naming_file_line_and_field(
    tmp_path: Path, fields: dict[str, Any], problem: str
) -> None:
    tenants = tmp_path / "rules" / "tenants"
    tenants.mkdir(parents=True)
    cred = {"name": "gh", "secret": "env:GH", "hosts": [HOST], **fields}
    doc = {
        "tenant": "t1",
        "sandboxes": [{"id": "sb1", "token": "env:TOKEN"}],
        "allow": [{"hosts": [HOST]}],
        "credentials": [cred],
    }
    (tenants / "t1.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(PolicyLoadError) as e:
        load_policy_dir(tmp_path / "rules")
    text = str(e.value)
    assert "t1.yaml:" in text and "tools" in text and problem in text, text
