"""Tests for sandgate.policy.rego.message_input and the "message" document (input version 2):
what Rego's input.mcp, input.jsonrpc and input.graphql hold, redacted as headers are."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from sandgate.policy.decision import EgressRequest, Identity, Phase
from sandgate.policy.protocols.graphql_ops import read_graphql_body
from sandgate.policy.protocols.json_strict import JsonValue, loads_strict
from sandgate.policy.protocols.jsonrpc import parse_jsonrpc
from sandgate.policy.protocols.mcp import parse_mcp
from sandgate.policy.rego.input_document import (
    INPUT_VERSION,
    REDACTED,
    InputDocument,
    input_document,
    path_tree,
    projected_input,
)
from sandgate.policy.rego.message_input import (
    graphql_inputs,
    graphql_variables,
    jsonrpc_inputs,
    mcp_inputs,
    redacted,
    session_digest,
)

WHO = Identity("acme", "acme-1")
REQUEST = EgressRequest(
    Phase.REQUEST,
    "mcp.example.com",
    443,
    scheme="https",
    method="POST",
    path="/mcp",
    sni="mcp.example.com",
    headers=(("Mcp-Session-Id", "sess-1234"), ("Content-Type", "application/json")),
    body_size=120,
)


def call(tool: str, arguments: dict[str, Any], rpc_id: int | str | None = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


def test_the_input_version_is_2() -> None:
    assert INPUT_VERSION == 2
    assert input_document(WHO, REQUEST, "93.184.215.14")["version"] == 2


def test_a_tool_call_is_one_mcp_object_with_every_field() -> None:
    body = parse_mcp(json.dumps(call("create_issue", {"repo": "acme/api", "labels": ["bug"]}, 7)))
    (item,) = mcp_inputs(body, "sess-1234")
    assert item.field == (
        "mcp",
        {
            "kind": "request",
            "method": "tools/call",
            "tool": "create_issue",
            "arguments": {"repo": "acme/api", "labels": ["bug"]},
            "uri": None,
            "prompt": None,
            "id": 7,
            "batch_index": None,
            "batch_size": 1,
            "session": hashlib.sha256(b"sess-1234").hexdigest(),
        },
    )
    assert (item.index, item.id, item.has_id, item.subject) == (None, 7, True, "create_issue")


def test_a_batch_numbers_its_members_and_reads_each_subject() -> None:
    batch = [
        call("search", {}, "a"),
        {"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": "file:///a.txt"}},
        {"jsonrpc": "2.0", "id": 3, "method": "prompts/get", "params": {"name": "review"}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 9, "result": {}},
    ]
    items = mcp_inputs(parse_mcp(json.dumps(batch)), None)
    fields = [i.field[1] for i in items]
    assert [(f["kind"], f["method"], f["batch_index"], f["batch_size"]) for f in fields] == [
        ("request", "tools/call", 0, 5),
        ("request", "resources/read", 1, 5),
        ("request", "prompts/get", 2, 5),
        ("notification", "notifications/initialized", 3, 5),
        ("response", None, 4, 5),
    ]
    assert (fields[1]["uri"], fields[1]["arguments"], fields[2]["prompt"]) == (
        "file:///a.txt",
        None,
        "review",
    )
    assert {f["session"] for f in fields} == {None}
    assert [i.has_id for i in items] == [True, True, True, False, True]


def test_a_call_without_arguments_has_an_empty_object() -> None:
    body = parse_mcp(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ping_tool"}}')
    assert mcp_inputs(body, None)[0].field[1]["arguments"] == {}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"repo": "a/b", "api_key": "k", "nested": {"Password": "p", "ok": 1}}, None),
        ([{"token": "t"}, "plain", {"x": [{"client_secret": "s"}]}], None),
        ("a string", "a string"),
        (42, 42),
    ],
    ids=["secret keys in an object, at depth", "secret keys inside arrays", "a string", "a number"],
)
def test_redaction_replaces_the_values_of_secret_looking_keys(value: JsonValue, expected: JsonValue) -> None:
    out = redacted(value)
    if expected is not None:
        assert out == expected
        return
    text = json.dumps(out)
    assert REDACTED in text
    assert all(secret not in text for secret in ('"k"', '"p"', '"t"', '"s"'))
    assert "a/b" in text or "plain" in text


def test_secret_arguments_are_redacted_in_the_mcp_object() -> None:
    body = parse_mcp(json.dumps(call("deploy", {"auth_token": "sk-live-123", "env": "prod"})))
    arguments = mcp_inputs(body, None)[0].field[1]["arguments"]
    assert arguments == {"auth_token": REDACTED, "env": "prod"}


def test_the_session_is_a_digest_never_the_value() -> None:
    assert session_digest(None) is None
    digest = session_digest("sess-1234")
    assert digest == hashlib.sha256(b"sess-1234").hexdigest() and "sess" not in digest


def test_jsonrpc_objects_keep_params_redacted() -> None:
    body = parse_jsonrpc(
        b'[{"jsonrpc":"2.0","id":1,"method":"eth_call","params":[{"to":"0x1","privateKey":"x"}]},'
        b'{"jsonrpc":"2.0","method":"eth_subscribe"}]'
    )
    first, second = (i.field for i in jsonrpc_inputs(body))
    assert first == (
        "jsonrpc",
        {
            "kind": "request",
            "method": "eth_call",
            "params": [{"to": "0x1", "privateKey": REDACTED}],
            "id": 1,
            "batch_index": 0,
            "batch_size": 2,
        },
    )
    assert second[1]["params"] is None and second[1]["kind"] == "notification"


def test_graphql_objects_are_one_per_operation_with_the_requests_variables() -> None:
    raw: JsonValue = {
        "query": "query Q { viewer { login } } mutation M { deleteRepo(id: 1) { id } }",
        "operationName": "Q",
        "variables": {"owner": "acme", "token": "t0p"},
    }
    requests = read_graphql_body(raw)
    items = graphql_inputs(requests, graphql_variables(raw))
    assert [i.field[1] for i in items] == [
        {
            "operation_type": "query",
            "operation_name": "Q",
            "root_fields": ["viewer"],
            "selected": True,
            "variables": {"owner": "acme", "token": REDACTED},
            "persisted_sha256": None,
            "introspection": False,
            "batch_index": None,
            "batch_size": 1,
        },
        {
            "operation_type": "mutation",
            "operation_name": "M",
            "root_fields": ["deleteRepo"],
            "selected": False,
            "variables": {"owner": "acme", "token": REDACTED},
            "persisted_sha256": None,
            "introspection": False,
            "batch_index": None,
            "batch_size": 1,
        },
    ]
    assert [(i.index, i.subject) for i in items] == [(0, "query Q"), (0, "mutation M")]


def test_a_graphql_batch_and_a_persisted_query_without_its_text() -> None:
    digest = "a" * 64
    raw: JsonValue = [
        {"query": "{ a }"},
        {"extensions": {"persistedQuery": {"version": 1, "sha256Hash": digest}}},
    ]
    items = graphql_inputs(read_graphql_body(raw), graphql_variables(raw))
    fields = [i.field[1] for i in items]
    assert [(f["batch_index"], f["batch_size"], f["operation_type"]) for f in fields] == [
        (0, 2, "query"),
        (1, 2, None),
    ]
    assert (fields[1]["persisted_sha256"], fields[1]["root_fields"], fields[0]["variables"]) == (
        digest,
        [],
        None,
    )


def test_a_message_document_is_the_requests_with_phase_message_and_validates() -> None:
    (item,) = mcp_inputs(parse_mcp(json.dumps(call("create_issue", {"repo": "acme/api"}))), "sess-1234")
    doc = input_document(WHO, REQUEST, "93.184.215.14", item.field)
    assert doc["phase"] == "message" and doc["version"] == 2
    assert doc["request"]["headers"]["mcp-session-id"] == REDACTED
    assert doc["mcp"]["tool"] == "create_issue"
    assert "jsonrpc" not in doc and "graphql" not in doc
    InputDocument.model_validate(doc)
    assert "sess-1234" not in json.dumps(doc)


@pytest.mark.parametrize(
    "field",
    [
        (
            "jsonrpc",
            jsonrpc_inputs(parse_jsonrpc(b'{"jsonrpc":"2.0","id":"x","method":"m","params":{"a":1}}')),
        ),
        ("graphql", graphql_inputs(read_graphql_body(loads_strict(b'{"query":"{ a }"}')), ())),
    ],
    ids=["a json-rpc message", "a graphql operation"],
)
def test_other_protocols_documents_validate(field: tuple[str, Any]) -> None:
    name, items = field
    doc = input_document(WHO, REQUEST, None, items[0].field)
    assert set(doc) - {
        "version",
        "phase",
        "tenant",
        "sandbox",
        "client",
        "dest",
        "request",
        "credentials",
    } == {name}
    InputDocument.model_validate(doc)


def test_a_request_document_has_no_message_fields() -> None:
    doc = input_document(WHO, REQUEST, None)
    assert doc["phase"] == "request" and not {"mcp", "jsonrpc", "graphql"} & set(doc)


def test_projection_builds_only_the_message_fields_the_policy_reads() -> None:
    (item,) = mcp_inputs(
        parse_mcp(json.dumps(call("create_issue", {"repo": "acme/api", "body": "long"}))), None
    )
    tree = path_tree(frozenset({("phase",), ("mcp", "tool"), ("mcp", "arguments", "repo")}))
    assert projected_input(WHO, REQUEST, None, tree, item.field) == {
        "phase": "message",
        "mcp": {"tool": "create_issue", "arguments": {"repo": "acme/api"}},
    }
    # A policy reading input.mcp sees nothing of it at the request phase.
    assert projected_input(WHO, REQUEST, None, tree) == {"phase": "request"}
