"""Refusals as JSON-RPC errors an agent can read, one per request id. No I/O.

A denied call is answered in its protocol (never an HTTP 403 that ends an MCP session):
an error object for its id with a code, a message naming the reason, and `data` carrying
the reason code, the rule, the detail and, where an approval could change the answer, the
`ask` proposal the gateway passes in. Notifications get no answer (they have no id).
"""

from __future__ import annotations

from collections.abc import Mapping

from sandgate.policy.protocols.decide import BodyVerdict, MessageVerdict, Verdict
from sandgate.policy.protocols.errors import Problem
from sandgate.policy.protocols.json_strict import JsonValue
from sandgate.policy.reasons import Reason

__all__ = [
    "DENIED",
    "INVALID_REQUEST",
    "PARSE_ERROR",
    "error_answer",
    "graphql_refusal_answer",
    "refusal_answer",
]

# JSON-RPC 2.0's reserved codes, and one of its server range (-32000 to -32099) for policy.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
DENIED = -32001

# A body that is not strict JSON is JSON-RPC's "parse error"; the rest "invalid request".
_JSON_PROBLEMS = frozenset(
    {
        Problem.NOT_JSON,
        Problem.INVALID_UTF8,
        Problem.BOM,
        Problem.DUPLICATE_KEY,
        Problem.NOT_FINITE,
        Problem.UNPAIRED_SURROGATE,
        Problem.TOO_DEEP,
        Problem.TOO_LARGE,
    }
)


def error_answer(verdict: MessageVerdict, ask: Mapping[str, JsonValue] | None = None) -> dict[str, JsonValue]:
    """The JSON-RPC error answering one refused request."""
    code = INVALID_REQUEST if verdict.reason is Reason.INVALID_REQUEST else DENIED
    data: dict[str, JsonValue] = {
        "reason": str(verdict.reason),
        "rule": verdict.rule,
        "detail": verdict.detail,
    }
    if verdict.index is not None:
        data["batch_index"] = verdict.index
    if ask is not None:
        data["ask"] = dict(ask)
    error: dict[str, JsonValue] = {
        "code": code,
        "message": f"denied by sandgate: {verdict.reason}",
        "data": data,
    }
    return {"jsonrpc": "2.0", "id": verdict.id, "error": error}


def refusal_answer(body: BodyVerdict, ask: Mapping[str, JsonValue] | None = None) -> JsonValue:
    """The answer to a refused body: one error, a batch of errors (one per request id), or
    None when nothing is to be answered (only notifications). A body that could not be read
    gets one error: for its one message's id when that could be read, else for id null."""
    if body.verdict is Verdict.ALLOW:
        raise ValueError("an allowed body is forwarded, not answered")
    if not body.messages:
        code = PARSE_ERROR if body.problem in _JSON_PROBLEMS else INVALID_REQUEST
        data: dict[str, JsonValue] = {"reason": str(body.reason), "detail": body.detail}
        error: dict[str, JsonValue] = {
            "code": code,
            "message": f"denied by sandgate: {body.reason}",
            "data": data,
        }
        return {"jsonrpc": "2.0", "id": None, "error": error}
    answers: list[JsonValue] = [error_answer(m, ask) for m in body.messages if m.has_id]
    if not answers:
        return None
    return answers if body.batch else answers[0]


def graphql_refusal_answer(body: BodyVerdict) -> JsonValue:
    """The answer to a refused GraphQL body, as GraphQL-over-HTTP's `errors` (no `data`: nothing
    ran): one object, or one per request of a batch, each naming its reason and rule in
    `extensions`."""
    if body.verdict is Verdict.ALLOW:
        raise ValueError("an allowed body is forwarded, not answered")

    def one(reason: object, rule: str | None, detail: str) -> dict[str, JsonValue]:
        extensions: dict[str, JsonValue] = {"code": "SANDGATE_DENIED", "reason": str(reason), "rule": rule}
        extensions["detail"] = detail
        return {"errors": [{"message": f"denied by sandgate: {reason}", "extensions": extensions}]}

    if body.batch and body.messages:
        return [one(m.reason, m.rule, m.detail) for m in body.messages]
    return one(body.reason, body.rule, body.detail)
