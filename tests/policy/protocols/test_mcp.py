"""Tests for sandgate.policy.protocols.mcp: what an MCP message asks for, tool names read only
in their one canonical form (case, confusables, whitespace, NUL), and messages built by the
official MCP SDK read as the SDK means them."""

from __future__ import annotations

import json

import mcp.types as sdk
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from sandgate.policy.protocols.errors import McpError, Problem
from sandgate.policy.protocols.jsonrpc import Kind
from sandgate.policy.protocols.mcp import TOOL_NAME, canonical_tool_name, parse_mcp


def call(name: object, arguments: object = None, *, rpc_id: object = 1, params: object = None) -> bytes:
    if params is None:
        params = {"name": name} if arguments is None else {"name": name, "arguments": arguments}
    return json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params}).encode()


def test_a_tool_call_names_its_tool_and_arguments() -> None:
    (message,) = parse_mcp(call("create_issue", {"repo": "octo/app", "labels": ["a"]})).messages
    assert (message.method, message.tool, message.arguments) == (
        "tools/call",
        "create_issue",
        {"repo": "octo/app", "labels": ["a"]},
    )


def test_absent_arguments_read_as_empty() -> None:
    (message,) = parse_mcp(call("search")).messages
    assert message.arguments == {}


def test_a_resource_read_names_its_uri_and_a_prompt_get_its_name() -> None:
    body = parse_mcp(
        b'[{"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "repo://octo/app/README"}},'
        b' {"jsonrpc": "2.0", "id": 2, "method": "prompts/get", "params": {"name": "summarise"}}]'
    )
    resource, prompt = body.messages
    assert (resource.uri, prompt.prompt, prompt.index) == ("repo://octo/app/README", "summarise", 1)


def test_other_methods_and_responses_are_read_without_a_subject() -> None:
    body = parse_mcp(
        b'[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"jsonrpc": "2.0", "method": "notifications/initialized"},'
        b' {"jsonrpc": "2.0", "id": "s1", "result": {}}]'
    )
    assert [(m.method, m.tool, m.rpc.kind) for m in body.messages] == [
        ("tools/list", None, Kind.REQUEST),
        ("notifications/initialized", None, Kind.NOTIFICATION),
        (None, None, Kind.RESPONSE),
    ]


NAMES_REFUSED = [
    ("delete_repo ", Problem.BAD_TOOL_NAME, "whitespace", "a trailing space is refused"),
    (" delete_repo", Problem.BAD_TOOL_NAME, "whitespace", "a leading space is refused"),
    ("delete_repo\x00", Problem.BAD_TOOL_NAME, "control character U+0000", "a trailing NUL is refused"),
    ("delete\x00_repo", Problem.BAD_TOOL_NAME, "control character U+0000", "an inner NUL is refused"),
    ("delete_repo\t", Problem.BAD_TOOL_NAME, "whitespace", "a tab is refused"),
    ("delete_rep\u043e", Problem.BAD_TOOL_NAME, "CYRILLIC SMALL LETTER O", "a Cyrillic o is refused"),
    ("del\u0435te_repo", Problem.BAD_TOOL_NAME, "CYRILLIC SMALL LETTER IE", "a Cyrillic e is refused"),
    ("\u0430dmin", Problem.BAD_TOOL_NAME, "CYRILLIC SMALL LETTER A", "a Cyrillic a is refused"),
    ("delete\u200b_repo", Problem.BAD_TOOL_NAME, "U+200B", "a zero-width space is refused"),
    (
        "ｄｅｌｅｔｅ_repo",
        Problem.TOOL_NAME_NOT_CANONICAL,
        "reads as 'delete_repo'",
        "full-width letters are refused",
    ),
    (
        "delete\ufe4drepo",
        Problem.TOOL_NAME_NOT_CANONICAL,
        "reads as 'delete_repo'",
        "a compatibility underscore is refused",
    ),
    ("", Problem.BAD_TOOL_NAME, "empty", "an empty name is refused"),
    ("a" * 129, Problem.BAD_TOOL_NAME, "longer than 128", "a name over 128 characters is refused"),
    ("a b", Problem.BAD_TOOL_NAME, "outside", "an inner space is refused"),
    ("a*", Problem.BAD_TOOL_NAME, "outside", "a glob character is refused"),
    (5, Problem.BAD_TOOL_NAME, "not a string", "a number is refused"),
    (None, Problem.BAD_TOOL_NAME, "not a string", "a missing name is refused"),
]


@pytest.mark.parametrize(
    ("name", "code", "words"), [c[:3] for c in NAMES_REFUSED], ids=[c[3] for c in NAMES_REFUSED]
)
def test_tool_names_not_in_canonical_form_are_refused(name: object, code: Problem, words: str) -> None:
    with pytest.raises(McpError) as caught:
        parse_mcp(call(name))
    assert caught.value.code is code
    assert words in str(caught.value)


@pytest.mark.parametrize(
    "name", ["delete_repo", "Delete_Repo", "github/create_issue", "ns:tool.v2", "a-b", "x" * 128]
)
def test_canonical_names_are_read_as_written_case_kept(name: str) -> None:
    assert canonical_tool_name(name) == name


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=140))
def test_a_name_is_read_only_when_it_is_ascii_in_the_charset(name: str) -> None:
    try:
        read = canonical_tool_name(name)
    except McpError:
        assert not TOOL_NAME.fullmatch(name)
    else:
        assert read == name and name.isascii() and name == name.strip()


SHAPES_REFUSED = [
    (call("x", params=["x", {}]), Problem.BAD_PARAMS, "params as an array for tools/call is refused"),
    (call("x", arguments=["a"]), Problem.BAD_ARGUMENTS, "arguments as an array are refused"),
    (call("x", arguments="a"), Problem.BAD_ARGUMENTS, "arguments as a string are refused"),
    (call("x", params={"arguments": {}}), Problem.BAD_TOOL_NAME, "a call without a name is refused"),
    (call("x", rpc_id=None), Problem.BAD_ID, "a null request id is refused"),
    (
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": []}',
        Problem.BAD_PARAMS,
        "params as an array for any MCP method is refused",
    ),
    (
        b'{"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "file:///srv/../etc/passwd"}}',
        Problem.BAD_PARAMS,
        "a resource uri with a dot-dot segment is refused",
    ),
    (
        b'{"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "file:///srv/%2e%2e/etc"}}',
        Problem.BAD_PARAMS,
        "a resource uri with encoded dots is refused",
    ),
    (
        b'{"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {}}',
        Problem.BAD_PARAMS,
        "a resource read without a uri is refused",
    ),
    (
        b'{"jsonrpc": "2.0", "id": 1, "method": "prompts/get", "params": {"name": "p\\u0000"}}',
        Problem.BAD_TOOL_NAME,
        "a prompt name with NUL is refused",
    ),
]


@pytest.mark.parametrize(
    ("body", "code"), [c[:2] for c in SHAPES_REFUSED], ids=[c[2] for c in SHAPES_REFUSED]
)
def test_message_shapes_mcp_does_not_allow_are_refused(body: bytes, code: Problem) -> None:
    with pytest.raises(McpError) as caught:
        parse_mcp(body)
    assert caught.value.code is code


def test_a_refused_single_message_carries_its_id_for_the_answer() -> None:
    with pytest.raises(McpError) as caught:
        parse_mcp(call("bad name", rpc_id="req-9"))
    assert (caught.value.rpc_id, caught.value.has_id) == ("req-9", True)


def test_a_duplicate_name_key_is_refused_before_mcp_reads_it() -> None:
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search", "name": "delete_repo"}}'
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the JSON layer's error
        parse_mcp(body)
    assert getattr(caught.value, "code", None) is Problem.DUPLICATE_KEY


# --- the official MCP SDK builds the messages --------------------------------------------


def sdk_message(request: BaseModel, rpc_id: int | str) -> bytes:
    """A request as the SDK's client sends it: JSONRPCRequest around the request's dump."""
    dumped = request.model_dump(by_alias=True, mode="json", exclude_none=True)
    return (
        sdk.JSONRPCRequest(jsonrpc="2.0", id=rpc_id, **dumped)
        .model_dump_json(by_alias=True, exclude_none=True)
        .encode()
    )


def test_an_sdk_tools_call_is_read_as_the_sdk_means_it() -> None:
    request = sdk.CallToolRequest(
        params=sdk.CallToolRequestParams(
            name="create_issue", arguments={"repo": "octo/app", "n": [1, {"x": None}]}
        )
    )
    (message,) = parse_mcp(sdk_message(request, 42)).messages
    assert (message.rpc.id, message.method, message.tool, message.arguments) == (
        42,
        "tools/call",
        "create_issue",
        {"repo": "octo/app", "n": [1, {"x": None}]},
    )


def test_an_sdk_tools_list_and_read_resource_are_read() -> None:
    listed = parse_mcp(sdk_message(sdk.ListToolsRequest(), "a")).messages[0]
    read = parse_mcp(
        sdk_message(sdk.ReadResourceRequest(params=sdk.ReadResourceRequestParams(uri="repo://octo/app")), 2)
    ).messages[0]
    assert (listed.method, listed.rpc.id, read.uri) == ("tools/list", "a", "repo://octo/app")


def test_an_sdk_tool_result_response_is_read_as_a_response() -> None:
    result = sdk.CallToolResult(content=[sdk.TextContent(type="text", text="ok")])
    response = sdk.JSONRPCResponse(
        jsonrpc="2.0", id=42, result=result.model_dump(by_alias=True, mode="json", exclude_none=True)
    )
    (message,) = parse_mcp(response.model_dump_json(by_alias=True, exclude_none=True)).messages
    assert message.rpc.kind is Kind.RESPONSE
    assert message.rpc.id == 42
