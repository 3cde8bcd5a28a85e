"""Tests for sandgate.policy.protocols.list_filter: list answers keep only what a call would
not be refused for, in JSON and in event streams cut anywhere; what cannot be read is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy.protocols.errors import Problem, ProtocolError
from sandgate.policy.protocols.json_strict import JsonValue
from sandgate.policy.protocols.list_filter import (
    ListCalls,
    SseListFilter,
    filter_list_body,
    filter_list_message,
    list_calls,
    visible,
)
from sandgate.policy.protocols.mcp import parse_mcp
from sandgate.policy.protocols.rules import McpSection

SECTION = McpSection.model_validate(
    {
        "tools": {
            "allow": ["search_*", "create_issue"],
            "ask": ["merge_*"],
            "deny": ["delete_*"],
            "arguments": {"create_issue": [{"path": "repo", "one_of": ["octo/app"]}]},
        },
        "resources": {"allow": ["repo://octo/*"], "deny": ["repo://octo/secret*"]},
        "prompts": {"allow": ["summarise"]},
    }
)
TOOLS = ["search_issues", "create_issue", "merge_pull", "delete_repo", "DELETE_repo", "push_code"]
KEPT = ["search_issues", "create_issue", "merge_pull"]


def tools_result(names: list[str], rpc_id: int | str = 1) -> dict[str, JsonValue]:
    tools: list[JsonValue] = [{"name": n, "inputSchema": {"type": "object"}} for n in names]
    return {"jsonrpc": "2.0", "id": rpc_id, "result": {"tools": tools, "nextCursor": "c2"}}


def calls(*pairs: tuple[int | str, str]) -> ListCalls:
    return ListCalls(SECTION, tuple(pairs))


def names(message: Any, key: str = "tools", field: str = "name") -> list[str]:
    return [entry[field] for entry in message["result"][key]]


@pytest.mark.parametrize(
    ("method", "entry", "shown"),
    [
        ("tools/list", {"name": "search_issues"}, True),
        ("tools/list", {"name": "merge_pull"}, True),
        ("tools/list", {"name": "create_issue"}, True),
        ("tools/list", {"name": "delete_repo"}, False),
        ("tools/list", {"name": "Delete_Repo"}, False),
        ("tools/list", {"name": "push_code"}, False),
        ("tools/list", {"name": "Search_issues"}, False),
        ("tools/list", {"name": "search_issues\x00"}, False),
        ("tools/list", {"name": "search_iss\u0430es"}, False),
        ("tools/list", {"title": "no name"}, False),
        ("tools/list", "search_issues", False),
        ("resources/list", {"uri": "repo://octo/app", "name": "app"}, True),
        ("resources/list", {"uri": "repo://octo/secrets", "name": "s"}, False),
        ("resources/list", {"uri": "repo://other/app", "name": "o"}, False),
        ("resources/list", {"uri": "repo://octo/app/../secrets", "name": "dots"}, False),
        ("prompts/list", {"name": "summarise"}, True),
        ("prompts/list", {"name": "exfiltrate"}, False),
    ],
    ids=[
        "an allowed tool is shown",
        "an ask tool is shown: an approval can let it through",
        "a tool with argument predicates is shown: some arguments pass",
        "a denied tool is removed",
        "a denied tool in another case is removed",
        "a tool no rule allows is removed",
        "an allowed name in another case is removed (allow matches as written)",
        "a name with a NUL is removed",
        "a name with a confusable is removed",
        "an entry without a name is removed",
        "an entry that is not an object is removed",
        "an allowed resource is shown",
        "a denied resource is removed",
        "a resource no glob allows is removed",
        "a resource URI with dot segments is removed",
        "an allowed prompt is shown",
        "a prompt no glob allows is removed",
    ],
)
def test_an_entry_is_shown_when_a_call_on_it_would_not_be_refused(
    method: str, entry: JsonValue, shown: bool
) -> None:
    assert visible(SECTION, method, entry)[0] is shown


def test_no_tool_is_shown_when_tools_call_is_not_an_allowed_method() -> None:
    section = McpSection.model_validate({"methods": {"deny": ["tools/call"]}, "tools": {"allow": ["*"]}})
    assert visible(section, "tools/list", {"name": "search_issues"}) == (False, "search_issues")


def test_a_tools_list_result_keeps_allowed_and_ask_tools_and_everything_else_in_it() -> None:
    message = tools_result(TOOLS)
    filtered, removed = filter_list_message(SECTION, "tools/list", message)
    assert names(filtered) == KEPT
    assert removed == ("delete_repo", "DELETE_repo", "push_code")
    assert filtered["result"]["nextCursor"] == "c2"  # type: ignore[index,call-overload]
    assert names(message) == TOOLS, "the input is not changed"


def test_a_result_with_nothing_to_remove_is_the_same_message() -> None:
    message = tools_result(KEPT)
    assert filter_list_message(SECTION, "tools/list", message) == (message, ())


def test_an_error_answer_passes() -> None:
    message: dict[str, JsonValue] = {"jsonrpc": "2.0", "id": 1, "error": {"code": -1, "message": "x"}}
    assert filter_list_message(SECTION, "tools/list", message) == (message, ())


def test_a_list_that_is_not_an_array_is_refused() -> None:
    message: dict[str, JsonValue] = {"jsonrpc": "2.0", "id": 1, "result": {"tools": {"name": "delete_repo"}}}
    with pytest.raises(ProtocolError):
        filter_list_message(SECTION, "tools/list", message)


def test_list_calls_are_the_requests_of_list_methods_by_id() -> None:
    body = parse_mcp(
        json.dumps(
            [
                {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                {"jsonrpc": "2.0", "id": "p", "method": "prompts/list", "params": {}},
                {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "x"}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
            ]
        )
    )
    found = list_calls(SECTION, body)
    assert found is not None and found.calls == ((1, "tools/list"), ("p", "prompts/list"))
    assert found.method_of("1") == "tools/list", "ids compare as JSON-RPC batches do: fail closed"
    assert found.method_of(3) is None
    assert list_calls(SECTION, parse_mcp(b'{"jsonrpc":"2.0","id":1,"method":"ping"}')) is None


def test_a_json_answer_is_rewritten_and_an_unrelated_one_left_alone() -> None:
    answer = json.dumps(tools_result(TOOLS, 7)).encode()
    filtered = filter_list_body(calls((7, "tools/list")), answer)
    assert filtered.data is not None and names(json.loads(filtered.data)) == KEPT
    assert filtered.removed == (
        ("tools/list", "delete_repo"),
        ("tools/list", "DELETE_repo"),
        ("tools/list", "push_code"),
    )
    assert filter_list_body(calls((8, "tools/list")), answer).data is None


def test_a_batch_answer_is_filtered_member_by_member() -> None:
    batch = [
        tools_result(TOOLS, 1),
        {"jsonrpc": "2.0", "id": 2, "result": {"prompts": [{"name": "summarise"}, {"name": "leak"}]}},
        {"jsonrpc": "2.0", "id": 3, "result": {"tools": [{"name": "delete_repo"}]}},
    ]
    filtered = filter_list_body(calls((1, "tools/list"), (2, "prompts/list")), json.dumps(batch))
    assert filtered.data is not None
    out = json.loads(filtered.data)
    assert names(out[0]) == KEPT and names(out[1], "prompts") == ["summarise"]
    assert out[2] == batch[2], "an answer to a call that was not a list call is not touched"


@pytest.mark.parametrize(
    "answer",
    [
        b'{"jsonrpc":"2.0","id":1,"result":{"tools":[]},"result":{"tools":[{"name":"delete_repo"}]}}',
        b'{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"delete_repo"}]}} trailing',
        b"<html>error</html>",
        b'[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","id":"1","result":{}}]',
    ],
    ids=[
        "a result given twice (readers keep different ones)",
        "trailing data after the message",
        "not JSON at all",
        "two answers with the same id",
    ],
)
def test_an_answer_that_cannot_be_read_strictly_is_refused(answer: bytes) -> None:
    with pytest.raises(ProtocolError):
        filter_list_body(calls((1, "tools/list")), answer)


# --- event streams ----------------------------------------------------------------------------

NOTE = b'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/progress","params":{}}\r\n\r\n'
PRIME = b"id: s1-0\ndata:\n\n"
KEEPALIVE = b": ping - 2025\r\n\r\n"


def list_event(rpc_id: int = 1, *, end: bytes = b"\n") -> bytes:
    data = json.dumps(tools_result(TOOLS, rpc_id)).encode()
    return b"event: message" + end + b"id: s1-1" + end + b"data: " + data + end + end


def run(sse: SseListFilter, stream: bytes, cuts: list[int]) -> bytes:
    out = bytearray()
    last = 0
    for cut in [*sorted(cuts), len(stream)]:
        out += sse.feed(stream[last:cut])
        last = cut
    return bytes(out + sse.close())


def events_of(stream: bytes) -> list[bytes]:
    return [e for e in stream.replace(b"\r\n", b"\n").split(b"\n\n") if e]


def data_of(event: bytes) -> Any:
    (line,) = [line for line in event.split(b"\n") if line.startswith(b"data:")]
    return json.loads(line[5:])


def test_an_event_answering_a_list_call_is_rewritten_its_other_lines_kept() -> None:
    sse = SseListFilter(calls((1, "tools/list")))
    out = run(sse, PRIME + KEEPALIVE + NOTE + list_event() + KEEPALIVE, [])
    assert out.startswith(PRIME + KEEPALIVE + NOTE), "events that answer no list call go byte for byte"
    assert out.endswith(KEEPALIVE)
    rewritten = out[len(PRIME + KEEPALIVE + NOTE) : -len(KEEPALIVE)]
    assert rewritten.startswith(b"event: message\nid: s1-1\ndata: ")
    assert names(data_of(rewritten)) == KEPT
    assert [n for _, n in sse.removed] == ["delete_repo", "DELETE_repo", "push_code"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(PRIME + NOTE + list_event(end=b"\r\n"))), max_size=8))
def test_the_same_events_come_out_wherever_the_stream_is_cut(cuts: list[int]) -> None:
    stream = PRIME + NOTE + list_event(end=b"\r\n")
    out = run(SseListFilter(calls((1, "tools/list"))), stream, cuts)
    whole = run(SseListFilter(calls((1, "tools/list"))), stream, [])
    assert out == whole
    assert names(data_of(events_of(out)[-1])) == KEPT


def test_a_crlf_cut_between_chunks_ends_one_line_not_two() -> None:
    event = list_event(end=b"\r\n")
    cut = event.index(b"\r\n") + 1
    sse = SseListFilter(calls((1, "tools/list")))
    out = sse.feed(event[:cut]) + sse.feed(event[cut:]) + sse.close()
    assert names(data_of(events_of(out)[0])) == KEPT


def test_an_unfinished_event_at_the_end_is_dropped() -> None:
    sse = SseListFilter(calls((1, "tools/list")))
    out = run(sse, NOTE + list_event()[:-1], [])
    # Its lines before the data went out as they came (they dispatch nothing); its data did not.
    assert out == NOTE + b"event: message\nid: s1-1\n"


def test_an_event_over_the_bound_is_refused_and_so_is_everything_after() -> None:
    sse = SseListFilter(calls((1, "tools/list")), max_event=64)
    with pytest.raises(ProtocolError) as refused:
        sse.feed(list_event())
    assert refused.value.code in (Problem.LINE_TOO_LONG, Problem.EVENT_TOO_LARGE)
    with pytest.raises(ProtocolError):
        sse.feed(NOTE)


def test_comment_lines_without_end_are_bounded() -> None:
    sse = SseListFilter(calls((1, "tools/list")), max_event=64)
    line = b"data: {}\n: padding padding padding\n"
    for _ in range(3):
        sse.feed(line)  # held: the event is not over
    with pytest.raises(ProtocolError):
        sse.feed(line * 2)


def test_an_event_whose_data_is_not_json_rpc_is_refused() -> None:
    sse = SseListFilter(calls((1, "tools/list")))
    with pytest.raises(ProtocolError):
        sse.feed(b'data: {"jsonrpc":"2.0","id":1,"result":{},"result":{}}\n\n')


# --- answers by shape: a GET event stream (the older HTTP+SSE transport, a resumed stream) ---

BY_SHAPE = ListCalls(SECTION, (), by_shape=True)


def test_by_shape_a_response_that_is_only_a_list_is_filtered() -> None:
    answer = {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"tools": [{"name": "search_issues"}, {"name": "delete_repo"}]},
    }
    filtered = filter_list_body(BY_SHAPE, json.dumps(answer))
    assert filtered.data is not None
    assert [t["name"] for t in json.loads(filtered.data)["result"]["tools"]] == ["search_issues"]
    assert filtered.removed == (("tools/list", "delete_repo"),)


@pytest.mark.parametrize(
    "result",
    [
        {"tools": [{"name": "delete_repo"}], "content": []},
        {"content": [{"type": "text", "text": "tools"}]},
        {"resources": [{"uri": "file:///x"}], "isError": False},
    ],
    ids=["a list beside other keys", "a tool result", "resources beside a flag"],
)
def test_by_shape_any_other_result_passes_as_it_came(result: dict[str, Any]) -> None:
    answer = {"jsonrpc": "2.0", "id": 7, "result": result}
    assert filter_list_body(BY_SHAPE, json.dumps(answer)).data is None


def test_by_shape_the_endpoint_event_passes_and_message_events_are_filtered() -> None:
    stream = SseListFilter(BY_SHAPE)
    endpoint = b"event: endpoint\ndata: /messages/?session_id=abc\n\n"
    listed = {"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "delete_repo"}], "nextCursor": "n"}}
    message = b"event: message\ndata: " + json.dumps(listed).encode() + b"\n\n"
    out = stream.feed(endpoint) + stream.feed(message) + stream.close()
    assert out.startswith(endpoint)
    assert b"delete_repo" not in out and b'"nextCursor":"n"' in out


def test_by_id_a_list_shaped_answer_to_another_call_is_left_alone() -> None:
    calls = ListCalls(SECTION, ((1, "tools/list"),))
    answer = {"jsonrpc": "2.0", "id": 2, "result": {"tools": [{"name": "delete_repo"}]}}
    assert filter_list_body(calls, json.dumps(answer)).data is None
