"""Tests for sandgate.policy.protocols.jsonrpc: JSON-RPC 2.0 messages and batches, with the
shapes that could make the gateway and a server disagree about which message is which refused."""

from __future__ import annotations

import pytest

from sandgate.policy.protocols.errors import JsonError, JsonRpcError, Problem
from sandgate.policy.protocols.jsonrpc import Kind, parse_jsonrpc, read_jsonrpc


def test_a_request_keeps_its_id_type_method_and_params() -> None:
    body = parse_jsonrpc(b'{"jsonrpc": "2.0", "id": "7", "method": "m", "params": {"a": 1}}')
    assert not body.batch
    (message,) = body.messages
    assert (message.kind, message.id, message.has_id, message.method, message.params, message.index) == (
        Kind.REQUEST,
        "7",
        True,
        "m",
        {"a": 1},
        None,
    )


def test_a_message_without_an_id_is_a_notification() -> None:
    (message,) = parse_jsonrpc(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}').messages
    assert message.kind is Kind.NOTIFICATION
    assert not message.has_id


def test_a_null_id_is_a_request_with_id_none() -> None:
    (message,) = parse_jsonrpc(b'{"jsonrpc": "2.0", "id": null, "method": "m"}').messages
    assert (message.kind, message.id, message.has_id) == (Kind.REQUEST, None, True)


def test_params_as_an_array_is_kept() -> None:
    (message,) = parse_jsonrpc(b'{"jsonrpc": "2.0", "id": 1, "method": "m", "params": [1, 2]}').messages
    assert message.params == [1, 2]


def test_responses_carry_result_or_error() -> None:
    body = parse_jsonrpc(
        b'[{"jsonrpc": "2.0", "id": 1, "result": {"ok": true}},'
        b' {"jsonrpc": "2.0", "id": 2, "error": {"code": -1, "message": "x"}}]'
    )
    ok, failed = body.messages
    assert (ok.kind, ok.result, ok.error) == (Kind.RESPONSE, {"ok": True}, None)
    assert (failed.kind, failed.error, failed.index) == (Kind.RESPONSE, {"code": -1, "message": "x"}, 1)


def test_a_batch_numbers_its_members() -> None:
    body = parse_jsonrpc(
        b'[{"jsonrpc": "2.0", "id": 1, "method": "a"}, {"jsonrpc": "2.0", "method": "b"},'
        b' {"jsonrpc": "2.0", "id": 2, "method": "c"}]'
    )
    assert body.batch
    assert [(m.index, m.method, m.kind) for m in body.messages] == [
        (0, "a", Kind.REQUEST),
        (1, "b", Kind.NOTIFICATION),
        (2, "c", Kind.REQUEST),
    ]


REFUSED = [
    ([], Problem.EMPTY_BATCH, "an empty batch is refused"),
    ("x", Problem.NOT_JSONRPC, "a string body is refused"),
    ([1], Problem.NOT_JSONRPC, "a batch member that is not an object is refused"),
    ({"id": 1, "method": "m"}, Problem.BAD_VERSION, "a missing jsonrpc member is refused"),
    ({"jsonrpc": "1.0", "id": 1, "method": "m"}, Problem.BAD_VERSION, "jsonrpc 1.0 is refused"),
    ({"jsonrpc": 2.0, "id": 1, "method": "m"}, Problem.BAD_VERSION, "jsonrpc as a number is refused"),
    (
        {"jsonrpc": "2.0", "id": 1, "method": 5},
        Problem.BAD_METHOD,
        "a method that is not a string is refused",
    ),
    ({"jsonrpc": "2.0", "id": 1.5, "method": "m"}, Problem.BAD_ID, "a float id is refused"),
    ({"jsonrpc": "2.0", "id": True, "method": "m"}, Problem.BAD_ID, "a bool id is refused"),
    ({"jsonrpc": "2.0", "id": [1], "method": "m"}, Problem.BAD_ID, "an array id is refused"),
    (
        {"jsonrpc": "2.0", "id": 1, "method": "m", "params": "x"},
        Problem.BAD_PARAMS,
        "string params are refused",
    ),
    (
        {"jsonrpc": "2.0", "id": 1, "method": "m", "params": None},
        Problem.BAD_PARAMS,
        "null params are refused",
    ),
    (
        {"jsonrpc": "2.0", "id": 1, "method": "m", "result": 1},
        Problem.NOT_JSONRPC,
        "a request with a result is refused",
    ),
    ({"jsonrpc": "2.0", "id": 1}, Problem.NOT_JSONRPC, "a response without result or error is refused"),
    (
        {"jsonrpc": "2.0", "id": 1, "result": 1, "error": {}},
        Problem.NOT_JSONRPC,
        "a response with both is refused",
    ),
    (
        {"jsonrpc": "2.0", "id": 1, "error": "x"},
        Problem.NOT_JSONRPC,
        "an error that is not an object is refused",
    ),
    ({"jsonrpc": "2.0", "result": 1}, Problem.NOT_JSONRPC, "a response without an id is refused"),
    (
        [{"jsonrpc": "2.0", "id": 1, "method": "a"}, {"jsonrpc": "2.0", "id": 1, "method": "b"}],
        Problem.DUPLICATE_ID,
        "two requests with one id in a batch are refused",
    ),
    (
        [{"jsonrpc": "2.0", "id": 1, "method": "a"}, {"jsonrpc": "2.0", "id": "1", "method": "b"}],
        Problem.DUPLICATE_ID,
        "ids 1 and '1' in one batch collide",
    ),
    (
        [{"jsonrpc": "2.0", "id": None, "method": "a"}, {"jsonrpc": "2.0", "id": None, "method": "b"}],
        Problem.DUPLICATE_ID,
        "two null ids in one batch collide",
    ),
    (
        [{"jsonrpc": "2.0", "id": 3, "result": 1}, {"jsonrpc": "2.0", "id": 3, "method": "b"}],
        Problem.DUPLICATE_ID,
        "a response and a request with one id in a batch collide",
    ),
]


@pytest.mark.parametrize(("value", "code"), [c[:2] for c in REFUSED], ids=[c[2] for c in REFUSED])
def test_refused(value: object, code: Problem) -> None:
    with pytest.raises(JsonRpcError) as caught:
        read_jsonrpc(value)  # type: ignore[arg-type]
    assert caught.value.code is code


def test_a_batch_over_the_limit_is_refused() -> None:
    batch = [{"jsonrpc": "2.0", "method": "n"}] * 5
    with pytest.raises(JsonRpcError) as caught:
        read_jsonrpc(batch, max_batch=4)  # type: ignore[arg-type]
    assert caught.value.code is Problem.BATCH_TOO_LARGE


def test_notifications_never_collide() -> None:
    body = read_jsonrpc([{"jsonrpc": "2.0", "method": "n"}, {"jsonrpc": "2.0", "method": "n"}])
    assert len(body.messages) == 2


def test_a_body_that_is_not_strict_json_fails_before_json_rpc() -> None:
    with pytest.raises(JsonError) as caught:
        parse_jsonrpc(b'{"jsonrpc": "2.0", "id": 1, "method": "a", "method": "b"}')
    assert caught.value.code is Problem.DUPLICATE_KEY
