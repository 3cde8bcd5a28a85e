"""Tests for sandgate.policy.protocols.decide: verdicts on MCP, JSON-RPC and GraphQL bodies with
their reason codes and rules, and issue 26's hostile inputs, each refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy.protocols import patterns
from sandgate.policy.protocols.decide import (
    Verdict,
    decide_graphql_body,
    decide_jsonrpc_body,
    decide_mcp_body,
)
from sandgate.policy.protocols.errors import Problem
from sandgate.policy.protocols.json_strict import JsonLimits
from sandgate.policy.protocols.reasons import ProtocolReason as P
from sandgate.policy.protocols.rules import GraphqlSection, JsonRpcSection, McpSection
from sandgate.policy.protocols.sse import SseParser
from sandgate.policy.reasons import Reason as R

MCP = McpSection.model_validate(
    {
        "tools": {
            "allow": ["search_*", "get_*", "create_issue", "read_file"],
            "ask": ["create_*", "write_*"],
            "deny": ["delete_*", "Admin*"],
            "arguments": {
                "create_issue": [
                    {"path": "repo", "one_of": ["octo/app", "octo/docs"]},
                    {"path": "labels[*]", "max_length": 20},
                ],
                "create_*": [{"path": "title", "max_length": 100}],
                "get_*": [{"path": "page", "min": 1, "max": 10, "optional": True}],
            },
        },
        "resources": {"allow": ["repo://octo/*"], "deny": ["repo://octo/secrets*"]},
        "prompts": {"allow": ["summarise"]},
        "methods": {"deny": ["logging/*"]},
    }
)


def call(name: Any, arguments: Any = None, rpc_id: Any = 1) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name}
    if arguments is not None:
        params["arguments"] = arguments
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params}


def rpc(method: str, params: Any = None, rpc_id: Any = 1) -> dict[str, Any]:
    out: dict[str, Any] = {"jsonrpc": "2.0", "id": rpc_id, "method": method}
    if params is not None:
        out["params"] = params
    return out


MCP_CASES = [
    (
        call("search_code", {"q": "x"}),
        Verdict.ALLOW,
        R.ALLOWED,
        "mcp.tools.allow[0]",
        "an allowed tool is allowed",
    ),
    (call("delete_repo"), Verdict.DENY, P.TOOL_DENIED, "mcp.tools.deny[0]", "a denied tool is denied"),
    (
        call("Delete_Repo"),
        Verdict.DENY,
        P.TOOL_DENIED,
        "mcp.tools.deny[0]",
        "a deny glob matches in any case",
    ),
    (
        call("DELETE_REPO"),
        Verdict.DENY,
        P.TOOL_DENIED,
        "mcp.tools.deny[0]",
        "a deny glob matches in upper case",
    ),
    (
        call("admin_panel"),
        Verdict.DENY,
        P.TOOL_DENIED,
        "mcp.tools.deny[1]",
        "a capitalised deny glob matches lower case",
    ),
    (
        call("Search_code"),
        Verdict.DENY,
        P.TOOL_NOT_ALLOWED,
        None,
        "an allow glob matches only the case written",
    ),
    (
        call("READ_FILE"),
        Verdict.DENY,
        P.TOOL_NOT_ALLOWED,
        None,
        "an exact allow matches only the case written",
    ),
    (call("unknown"), Verdict.DENY, P.TOOL_NOT_ALLOWED, None, "an unlisted tool is denied"),
    (
        call("delete_rep\u043e"),
        Verdict.DENY,
        R.INVALID_REQUEST,
        None,
        "a Cyrillic confusable is an invalid request",
    ),
    (call("delete_repo "), Verdict.DENY, R.INVALID_REQUEST, None, "a trailing space is an invalid request"),
    (call("search_code\x00"), Verdict.DENY, R.INVALID_REQUEST, None, "a trailing NUL is an invalid request"),
    (
        call("ｓｅａｒｃｈ_code"),
        Verdict.DENY,
        R.INVALID_REQUEST,
        None,
        "a full-width name is an invalid request",
    ),
    (
        call("create_issue", {"repo": "octo/app", "title": "t", "labels": ["bug"]}),
        Verdict.ASK,
        R.APPROVAL_REQUIRED,
        "mcp.tools.ask[0]",
        "an ask tool with good arguments asks",
    ),
    (
        call("create_issue", {"repo": "evil/app", "title": "t"}),
        Verdict.DENY,
        P.ARGUMENT_NOT_ALLOWED,
        "mcp.tools.arguments[create_issue][0]",
        "an argument outside one_of is denied before asking",
    ),
    (
        call("create_issue", {"repo": "octo/app", "title": "t" * 101, "labels": []}),
        Verdict.DENY,
        P.ARGUMENT_NOT_ALLOWED,
        "mcp.tools.arguments[create_*][0]",
        "every matching arguments entry applies",
    ),
    (
        call("create_issue", {"title": "t"}),
        Verdict.DENY,
        P.ARGUMENT_NOT_ALLOWED,
        "mcp.tools.arguments[create_issue][0]",
        "a missing argument fails closed",
    ),
    (
        call("Create_Issue", {"repo": "x"}),
        Verdict.DENY,
        P.ARGUMENT_NOT_ALLOWED,
        "mcp.tools.arguments[create_issue][0]",
        "arguments entries match in any case",
    ),
    (
        call("write_file"),
        Verdict.ASK,
        R.APPROVAL_REQUIRED,
        "mcp.tools.ask[1]",
        "an ask glob alone makes a tool askable",
    ),
    (
        call("WRITE_file"),
        Verdict.ASK,
        R.APPROVAL_REQUIRED,
        "mcp.tools.ask[1]",
        "an ask glob matches in any case",
    ),
    (
        call("get_issue", {"page": 11}),
        Verdict.DENY,
        P.ARGUMENT_NOT_ALLOWED,
        "mcp.tools.arguments[get_*][0]",
        "a number over max is denied",
    ),
    (
        call("get_issue", {"page": True}),
        Verdict.DENY,
        P.ARGUMENT_NOT_ALLOWED,
        "mcp.tools.arguments[get_*][0]",
        "a bool is not a page number",
    ),
    (
        call("get_issue"),
        Verdict.ALLOW,
        R.ALLOWED,
        "mcp.tools.allow[1]",
        "an optional argument may be missing",
    ),
    (rpc("tools/list"), Verdict.ALLOW, R.ALLOWED, None, "tools/list is allowed by default"),
    (
        rpc("logging/setLevel", {"level": "debug"}),
        Verdict.DENY,
        P.RPC_METHOD_NOT_ALLOWED,
        "mcp.methods.deny[0]",
        "a denied method is denied",
    ),
    (
        rpc("tasks/get", {}),
        Verdict.DENY,
        P.RPC_METHOD_NOT_ALLOWED,
        None,
        "a method not in the defaults is denied",
    ),
    (
        rpc("resources/read", {"uri": "repo://octo/app"}),
        Verdict.ALLOW,
        R.ALLOWED,
        "mcp.resources.allow[0]",
        "an allowed resource is allowed",
    ),
    (
        rpc("resources/read", {"uri": "repo://octo/SECRETS"}),
        Verdict.DENY,
        P.RESOURCE_NOT_ALLOWED,
        "mcp.resources.deny[0]",
        "a resource deny glob matches in any case",
    ),
    (
        rpc("resources/read", {"uri": "repo://other/x"}),
        Verdict.DENY,
        P.RESOURCE_NOT_ALLOWED,
        None,
        "an unlisted resource is denied",
    ),
    (
        rpc("prompts/get", {"name": "summarise"}),
        Verdict.ALLOW,
        R.ALLOWED,
        "mcp.prompts.allow[0]",
        "an allowed prompt is allowed",
    ),
    (
        rpc("prompts/get", {"name": "Summarise"}),
        Verdict.DENY,
        P.PROMPT_NOT_ALLOWED,
        None,
        "a prompt allow matches the case written",
    ),
    (
        {"jsonrpc": "2.0", "id": 5, "result": {}},
        Verdict.ALLOW,
        R.ALLOWED,
        None,
        "a response to a server request is allowed",
    ),
    (
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ["delete_repo", {}]},
        Verdict.DENY,
        R.INVALID_REQUEST,
        None,
        "params as an array is an invalid request",
    ),
]


@pytest.mark.parametrize(
    ("body", "verdict", "reason", "rule"), [c[:4] for c in MCP_CASES], ids=[c[4] for c in MCP_CASES]
)
def test_mcp_messages(body: Any, verdict: Verdict, reason: Any, rule: str | None) -> None:
    decided, _ = decide_mcp_body(json.dumps(body).encode(), MCP)
    assert (decided.verdict, decided.reason, decided.rule) == (verdict, reason, rule)


HOSTILE_BODIES = [
    (
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search_x", "name": "delete_repo"}}',
        Problem.DUPLICATE_KEY,
        "the name key twice",
    ),
    (
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", /* c */ "params": {"name": "search_x"}}',
        Problem.NOT_JSON,
        "a comment",
    ),
    (
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "get_x", "arguments": {"page": NaN}}}',
        Problem.NOT_FINITE,
        "NaN in arguments",
    ),
    (b'\xef\xbb\xbf{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}', Problem.BOM, "a BOM"),
    (
        json.dumps([call("search_a", rpc_id=1), call("search_b", rpc_id=1)]).encode(),
        Problem.DUPLICATE_ID,
        "a batch whose ids collide",
    ),
    (
        json.dumps(call("search_a", {"q": {"a": [[[[[[[[[[[[]]]]]]]]]]]]}})).encode(),
        Problem.TOO_DEEP,
        "arguments nested past the depth limit",
    ),
]


@pytest.mark.parametrize(
    ("body", "problem"), [c[:2] for c in HOSTILE_BODIES], ids=[c[2] for c in HOSTILE_BODIES]
)
def test_hostile_bodies_are_invalid_requests(body: bytes, problem: Problem) -> None:
    decided, parsed = decide_mcp_body(body, MCP, JsonLimits(max_depth=10))
    assert (decided.verdict, decided.reason, decided.problem, parsed) == (
        Verdict.DENY,
        R.INVALID_REQUEST,
        problem,
        None,
    )


def test_a_batch_with_one_denied_call_refuses_every_call_each_for_its_id() -> None:
    batch = [
        call("search_a", rpc_id="a"),
        call("delete_repo", rpc_id="b"),
        {"jsonrpc": "2.0", "method": "notifications/progress"},
        call("get_c", rpc_id=3),
    ]
    decided, _ = decide_mcp_body(json.dumps(batch), MCP)
    assert (decided.verdict, decided.reason, decided.rule, decided.batch) == (
        Verdict.DENY,
        P.TOOL_DENIED,
        "mcp.tools.deny[0]",
        True,
    )
    assert [(m.id, m.index, m.verdict, m.reason) for m in decided.messages] == [
        ("a", 0, Verdict.DENY, P.BATCH_REFUSED),
        ("b", 1, Verdict.DENY, P.TOOL_DENIED),
        (None, 2, Verdict.DENY, P.BATCH_REFUSED),
        (3, 3, Verdict.DENY, P.BATCH_REFUSED),
    ]
    assert decided.messages[0].detail == "batch member 1 was denied (tool_denied)"


def test_a_batch_of_allowed_calls_is_allowed_and_one_ask_holds_it_whole() -> None:
    allowed, _ = decide_mcp_body(json.dumps([call("search_a", rpc_id=1), call("get_b", rpc_id=2)]), MCP)
    asked, _ = decide_mcp_body(json.dumps([call("search_a", rpc_id=1), call("write_b", rpc_id=2)]), MCP)
    assert allowed.verdict is Verdict.ALLOW
    assert (asked.verdict, asked.rule, [m.verdict for m in asked.messages]) == (
        Verdict.ASK,
        "mcp.tools.ask[1]",
        [Verdict.ALLOW, Verdict.ASK],
    )


def test_a_denied_call_smuggled_in_a_batch_with_an_invalid_member_is_refused() -> None:
    batch = [call("search_a", rpc_id=1), call("delete\x00", rpc_id=2)]
    decided, _ = decide_mcp_body(json.dumps(batch), MCP)
    assert (decided.verdict, decided.reason, decided.problem) == (
        Verdict.DENY,
        R.INVALID_REQUEST,
        Problem.BAD_TOOL_NAME,
    )


def test_each_message_verdict_names_its_subject() -> None:
    decided, _ = decide_mcp_body(json.dumps(call("Delete_Repo", rpc_id=9)), MCP)
    (message,) = decided.messages
    assert (message.subject, message.id, message.has_id) == ("Delete_Repo", 9, True)


# --- JSON-RPC ----------------------------------------------------------------------------

RPC = JsonRpcSection.model_validate({"methods": {"allow": ["eth_*", "net_version"], "deny": ["eth_sign*"]}})

RPC_CASES = [
    (
        rpc("eth_call", [{"to": "0x0"}]),
        Verdict.ALLOW,
        R.ALLOWED,
        "jsonrpc.methods.allow[0]",
        "an allowed method with array params is allowed",
    ),
    (
        rpc("eth_sendTransaction"),
        Verdict.ALLOW,
        R.ALLOWED,
        "jsonrpc.methods.allow[0]",
        "a glob allows a family",
    ),
    (
        rpc("eth_signTypedData"),
        Verdict.DENY,
        P.RPC_METHOD_NOT_ALLOWED,
        "jsonrpc.methods.deny[0]",
        "a deny glob wins",
    ),
    (
        rpc("ETH_SIGN"),
        Verdict.DENY,
        P.RPC_METHOD_NOT_ALLOWED,
        "jsonrpc.methods.deny[0]",
        "a deny glob matches in any case",
    ),
    (rpc("Net_Version"), Verdict.DENY, P.RPC_METHOD_NOT_ALLOWED, None, "an allow matches the case written"),
    (
        {"jsonrpc": "2.0", "method": "personal_unlock"},
        Verdict.DENY,
        P.RPC_METHOD_NOT_ALLOWED,
        None,
        "a notification is decided by its method",
    ),
    (
        [rpc("eth_call", rpc_id=1), rpc("eth_sign", rpc_id=2)],
        Verdict.DENY,
        P.RPC_METHOD_NOT_ALLOWED,
        "jsonrpc.methods.deny[0]",
        "a batch with a denied method is refused",
    ),
    ([], Verdict.DENY, R.INVALID_REQUEST, None, "an empty batch is an invalid request"),
]


@pytest.mark.parametrize(
    ("body", "verdict", "reason", "rule"), [c[:4] for c in RPC_CASES], ids=[c[4] for c in RPC_CASES]
)
def test_jsonrpc_messages(body: Any, verdict: Verdict, reason: Any, rule: str | None) -> None:
    decided, _ = decide_jsonrpc_body(json.dumps(body), RPC)
    assert (decided.verdict, decided.reason, decided.rule) == (verdict, reason, rule)


# --- GraphQL -----------------------------------------------------------------------------

LISTED = "c" * 64
GQL = GraphqlSection.model_validate(
    {
        "operation_types": ["query", "mutation"],
        "root_fields": {"allow": ["viewer", "repository", "mutation.addStar"], "deny": ["deleteRepository"]},
        "operation_names": {"deny": ["Admin*"]},
        "persisted_queries": [LISTED],
        "max_depth": 4,
        "max_aliases": 2,
        "max_fields": 20,
    }
)

GQL_CASES = [
    ({"query": "{ viewer { login } }"}, Verdict.ALLOW, R.ALLOWED, None, "an allowed query is allowed"),
    (
        {"query": "mutation { addStar(id: 1) { id } }"},
        Verdict.ALLOW,
        R.ALLOWED,
        None,
        "a field qualified by its type is allowed",
    ),
    (
        {"query": "mutation { ok: deleteRepository(id: 1) }"},
        Verdict.DENY,
        P.FIELD_NOT_ALLOWED,
        "graphql.root_fields.deny[0]",
        "a mutation behind an alias is denied",
    ),
    (
        {"query": "mutation { DeleteRepository(id: 1) }"},
        Verdict.DENY,
        P.FIELD_NOT_ALLOWED,
        "graphql.root_fields.deny[0]",
        "a field deny glob matches in any case",
    ),
    (
        {"query": "query A { viewer { id } } mutation B { deleteRepository(id: 1) }", "operationName": "A"},
        Verdict.DENY,
        P.FIELD_NOT_ALLOWED,
        "graphql.root_fields.deny[0]",
        "a mutation in a second operation is denied",
    ),
    (
        {"query": "mutation { ...F } fragment F on Mutation { deleteRepository(id: 1) }"},
        Verdict.DENY,
        P.FIELD_NOT_ALLOWED,
        "graphql.root_fields.deny[0]",
        "a mutation in a fragment is denied",
    ),
    (
        {"query": "query { addStar }"},
        Verdict.DENY,
        P.FIELD_NOT_ALLOWED,
        None,
        "a type-qualified allow does not cover another type",
    ),
    (
        {"query": "{ organization { id } }"},
        Verdict.DENY,
        P.FIELD_NOT_ALLOWED,
        None,
        "an unlisted root field is denied",
    ),
    (
        {"query": "subscription { viewer }"},
        Verdict.DENY,
        P.OPERATION_NOT_ALLOWED,
        "graphql.operation_types",
        "an unlisted operation type is denied",
    ),
    (
        {"query": "query AdminDump { viewer }"},
        Verdict.DENY,
        P.OPERATION_NOT_ALLOWED,
        "graphql.operation_names.deny[0]",
        "a denied operation name is denied",
    ),
    (
        {"query": "{ __schema { types { name } } }"},
        Verdict.DENY,
        P.INTROSPECTION_NOT_ALLOWED,
        None,
        "introspection is denied",
    ),
    (
        {"query": "{ viewer { __typename } __typename }"},
        Verdict.ALLOW,
        R.ALLOWED,
        None,
        "__typename is not introspection",
    ),
    (
        {"query": "{ viewer { a { b { c { d } } } } }"},
        Verdict.DENY,
        P.QUERY_TOO_COMPLEX,
        "graphql.max_depth",
        "a query over max_depth is denied",
    ),
    (
        {"query": "{ a: viewer { id } b: viewer { id } c: viewer { id } }"},
        Verdict.DENY,
        P.QUERY_TOO_COMPLEX,
        "graphql.max_aliases",
        "a query over max_aliases is denied",
    ),
    (
        {"extensions": {"persistedQuery": {"sha256Hash": LISTED}}},
        Verdict.ALLOW,
        R.ALLOWED,
        "graphql.persisted_queries[0]",
        "a listed persisted id is allowed",
    ),
    (
        {"extensions": {"persistedQuery": {"sha256Hash": "d" * 64}}},
        Verdict.DENY,
        P.PERSISTED_QUERY_UNKNOWN,
        None,
        "an unknown persisted id is denied",
    ),
    (
        {"query": "query A { viewer } query B { viewer }"},
        Verdict.DENY,
        R.INVALID_REQUEST,
        None,
        "two operations without a name are invalid",
    ),
    (
        [{"query": "{ viewer }"}, {"query": "mutation { deleteRepository }"}],
        Verdict.DENY,
        P.FIELD_NOT_ALLOWED,
        "graphql.root_fields.deny[0]",
        "a batch with a denied request is refused",
    ),
]


@pytest.mark.parametrize(
    ("body", "verdict", "reason", "rule"), [c[:4] for c in GQL_CASES], ids=[c[4] for c in GQL_CASES]
)
def test_graphql_requests(body: Any, verdict: Verdict, reason: Any, rule: str | None) -> None:
    decided, _ = decide_graphql_body(json.dumps(body), GQL)
    assert (decided.verdict, decided.reason, decided.rule) == (verdict, reason, rule)


def test_a_graphql_section_without_mutations_denies_an_aliased_mutation() -> None:
    decided, _ = decide_graphql_body(json.dumps({"query": "mutation { q: viewer }"}), GraphqlSection())
    assert (decided.verdict, decided.reason) == (Verdict.DENY, P.OPERATION_NOT_ALLOWED)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=11, max_size=11))
def test_every_casing_of_a_denied_tool_is_denied(upper: list[bool]) -> None:
    name = "".join(c.upper() if u else c for c, u in zip("delete_repo", upper, strict=True))
    decided, _ = decide_mcp_body(json.dumps(call(name)), MCP)
    assert (decided.verdict, decided.reason) == (Verdict.DENY, P.TOOL_DENIED)


def test_a_denied_call_in_an_sse_event_split_at_every_byte_is_denied() -> None:
    stream = b"event: message\r\ndata: " + json.dumps(call("delete_repo", rpc_id="s1")).encode() + b"\r\n\r\n"
    for cut in range(len(stream) + 1):
        parser = SseParser()
        events = parser.feed(stream[:cut]) + parser.feed(stream[cut:])
        (event,) = events
        decided, _ = decide_mcp_body(event.data, MCP)
        assert (decided.verdict, decided.reason) == (Verdict.DENY, P.TOOL_DENIED)


# A match that runs out of time never allows: MATCH_TIMEOUT 0 makes every glob time out.
TIMEOUT_CASES = [
    (
        {"allow": ["search_*"]},
        Verdict.DENY,
        P.TOOL_NOT_ALLOWED,
        None,
        "an allow glob that times out allows nothing",
    ),
    (
        {"allow": ["search_*"], "deny": ["delete_*"]},
        Verdict.DENY,
        P.TOOL_DENIED,
        "mcp.tools.deny[0]",
        "a deny glob that times out denies",
    ),
    (
        {"allow": ["search_*"], "ask": ["write_*"]},
        Verdict.ASK,
        R.APPROVAL_REQUIRED,
        "mcp.tools.ask[0]",
        "an ask glob that times out asks",
    ),
    (
        {"allow": ["search_code"], "arguments": {"other_*": [{"path": "q", "equals": "x"}]}},
        Verdict.DENY,
        P.ARGUMENT_NOT_ALLOWED,
        "mcp.tools.arguments[other_*][0]",
        "an arguments glob that times out applies its predicates",
    ),
    (
        {"allow": ["search_code"]},
        Verdict.ALLOW,
        R.ALLOWED,
        "mcp.tools.allow[0]",
        "an exact name needs no match",
    ),
]


@pytest.mark.parametrize(
    ("tools", "verdict", "reason", "rule"), [c[:4] for c in TIMEOUT_CASES], ids=[c[4] for c in TIMEOUT_CASES]
)
def test_a_glob_that_runs_out_of_time_never_allows(
    monkeypatch: pytest.MonkeyPatch, tools: dict[str, Any], verdict: Verdict, reason: Any, rule: str | None
) -> None:
    monkeypatch.setattr(patterns, "MATCH_TIMEOUT", 0.0)
    section = McpSection.model_validate({"tools": tools})
    decided, _ = decide_mcp_body(json.dumps(call("search_code", {"q": "y"})).encode(), section)
    assert (decided.verdict, decided.reason, decided.rule) == (verdict, reason, rule)


def test_an_argument_regex_that_runs_out_of_time_denies() -> None:
    section = McpSection.model_validate(
        {"tools": {"allow": ["grep"], "arguments": {"grep": [{"path": "q", "regex": "(x+x+)+y"}]}}}
    )
    decided, _ = decide_mcp_body(json.dumps(call("grep", {"q": "x" * 5_000})).encode(), section)
    assert (decided.verdict, decided.reason, decided.rule) == (
        Verdict.DENY,
        P.ARGUMENT_NOT_ALLOWED,
        "mcp.tools.arguments[grep][0]",
    )
    assert "in time" in decided.detail
