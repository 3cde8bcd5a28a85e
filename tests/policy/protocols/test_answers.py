"""Tests for sandgate.policy.protocols.answers: refusals answered as JSON-RPC errors for each id,
so an agent reads why and its session survives."""

from __future__ import annotations

import json

import pytest

from sandgate.policy.protocols.answers import DENIED, INVALID_REQUEST, PARSE_ERROR, refusal_answer
from sandgate.policy.protocols.decide import decide_mcp_body
from sandgate.policy.protocols.rules import McpSection

SECTION = McpSection.model_validate({"tools": {"allow": ["search"], "deny": ["delete_*"], "ask": ["write"]}})


def answer(body: object, ask: dict[str, object] | None = None) -> object:
    verdict, _ = decide_mcp_body(json.dumps(body) if not isinstance(body, bytes) else body, SECTION)
    return refusal_answer(verdict, ask)  # type: ignore[arg-type]


def call(name: str, rpc_id: object) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": {"name": name}}


def test_a_denied_call_is_an_error_for_its_id_naming_reason_and_rule() -> None:
    assert answer(call("delete_repo", "x1")) == {
        "jsonrpc": "2.0",
        "id": "x1",
        "error": {
            "code": DENIED,
            "message": "denied by sandgate: tool_denied",
            "data": {
                "reason": "tool_denied",
                "rule": "mcp.tools.deny[0]",
                "detail": "tool 'delete_repo' matches deny glob 'delete_*'",
            },
        },
    }


def test_an_ask_proposal_travels_in_the_error() -> None:
    out = answer(call("write", 1), {"propose": "https://sandgate.internal/requests"})
    assert isinstance(out, dict)
    assert out["error"]["data"]["ask"] == {"propose": "https://sandgate.internal/requests"}


def test_a_refused_batch_answers_every_request_id_and_no_notification() -> None:
    out = answer(
        [call("search", 1), call("delete_x", 2), {"jsonrpc": "2.0", "method": "notifications/progress"}]
    )
    assert isinstance(out, list)
    assert [(a["id"], a["error"]["data"]["reason"], a["error"]["data"]["batch_index"]) for a in out] == [
        (1, "batch_refused", 0),
        (2, "tool_denied", 1),
    ]


def test_an_invalid_tool_name_is_answered_for_its_id() -> None:
    out = answer(call("delete_rep\u043e", 7))
    assert isinstance(out, dict)
    assert (out["id"], out["error"]["code"], out["error"]["data"]["reason"]) == (
        7,
        INVALID_REQUEST,
        "invalid_request",
    )


@pytest.mark.parametrize(
    ("body", "code"),
    [(b'{"a": 1, "a": 2}', PARSE_ERROR), (b'{"jsonrpc": "1.0", "id": 1, "method": "x"}', INVALID_REQUEST)],
    ids=[
        "a body that is not strict json is a parse error",
        "a body that is not json-rpc is an invalid request",
    ],
)
def test_an_unreadable_body_is_one_error_for_id_null(body: bytes, code: int) -> None:
    out = answer(body)
    assert isinstance(out, dict)
    assert (out["id"], out["error"]["code"]) == (None, code)


def test_an_allowed_body_is_not_answered() -> None:
    verdict, _ = decide_mcp_body(json.dumps(call("search", 1)), SECTION)
    with pytest.raises(ValueError, match="forwarded"):
        refusal_answer(verdict)
