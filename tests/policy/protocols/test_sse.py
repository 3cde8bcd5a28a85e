"""Tests for sandgate.policy.protocols.sse: server-sent events read incrementally, the same
whatever the chunk boundaries, with memory bounded by max_line and max_event."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy.protocols.errors import Problem, SseError
from sandgate.policy.protocols.sse import SseEvent, SseParser

PROPERTY = settings(max_examples=300, deadline=None)

STREAM = (
    "\ufeff: a comment\r\n"
    "event: message\r\n"
    'data: {"jsonrpc": "2.0", "id": 1, "result": {"text": "h\u00e9llo \U0001f600"}}\r\n'
    "id: 41\r\n"
    "\r\n"
    "data: line one\n"
    "data:line two\n"
    "data\n"
    "retry: 3000\n"
    "\n"
    "event: ping\r"
    "data: x\r"
    "\r"
    "id: bad\x00id\n"
    "data: keeps id 41\n"
    "\n"
    "data: never dispatched"
).encode()

EXPECTED = [
    SseEvent("message", '{"jsonrpc": "2.0", "id": 1, "result": {"text": "h\u00e9llo \U0001f600"}}', "41"),
    SseEvent("message", "line one\nline two\n", "41"),
    SseEvent("ping", "x", "41"),
    SseEvent("message", "keeps id 41", "41"),
]


def parse_in(chunks: list[bytes]) -> list[SseEvent]:
    parser = SseParser()
    events = [event for chunk in chunks for event in parser.feed(chunk)]
    parser.close()
    return events


def test_a_stream_in_one_chunk() -> None:
    parser = SseParser()
    assert parser.feed(STREAM) == EXPECTED
    assert parser.retry == 3000


def test_a_stream_byte_by_byte() -> None:
    assert parse_in([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


@pytest.mark.parametrize("cut", range(len(STREAM) + 1))
def test_a_stream_cut_at_every_byte_boundary(cut: int) -> None:
    assert parse_in([STREAM[:cut], STREAM[cut:]]) == EXPECTED


@PROPERTY
@given(st.lists(st.integers(0, len(STREAM)), max_size=20))
def test_a_stream_cut_anywhere_reads_the_same(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    assert parse_in([STREAM[a:b] for a, b in itertools.pairwise(bounds)]) == EXPECTED


line_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"), max_size=20)


@PROPERTY
@given(
    st.lists(st.lists(line_text, min_size=1, max_size=3), min_size=1, max_size=5),
    st.sampled_from(["\n", "\r", "\r\n"]),
    st.data(),
)
def test_any_events_with_any_line_ending_cut_anywhere(
    events: list[list[str]], eol: str, data: st.DataObject
) -> None:
    raw = "".join("".join(f"data: {line}{eol}" for line in lines) + eol for lines in events).encode()
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=10))
    bounds = [0, *sorted(cuts), len(raw)]
    parsed = parse_in([raw[a:b] for a, b in itertools.pairwise(bounds)])
    assert [e.data for e in parsed] == ["\n".join(lines) for lines in events]


def test_a_cr_then_crlf_is_two_line_ends() -> None:
    parser = SseParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\r\n") == [SseEvent("message", "a")]


def test_an_event_over_the_limit_is_refused_and_the_stream_stays_refused() -> None:
    parser = SseParser(max_event=100)
    parser.feed(b"data: " + b"x" * 60 + b"\n")
    with pytest.raises(SseError) as caught:
        parser.feed(b"data: " + b"y" * 60 + b"\n")
    assert caught.value.code is Problem.EVENT_TOO_LARGE
    with pytest.raises(SseError):
        parser.feed(b"\n")


def test_a_line_over_the_limit_is_refused_even_when_it_comes_in_small_chunks() -> None:
    parser = SseParser(max_line=1000)
    for _ in range(62):
        parser.feed(b"data: xxxxxxxxxx")
    with pytest.raises(SseError) as caught:
        parser.feed(b"data: xxxxxxxxxx")
    assert caught.value.code is Problem.LINE_TOO_LONG


def test_a_long_stream_of_comments_and_events_keeps_nothing() -> None:
    parser = SseParser(max_line=100, max_event=100)
    chunk = b": keep-alive\n" * 10_000 + b"data: x\n\n"
    for _ in range(20):
        assert parser.feed(chunk) == [SseEvent("message", "x")]
    assert parser._pending == [] and parser._data == []


def test_invalid_utf8_refuses_the_stream() -> None:
    with pytest.raises(SseError) as caught:
        SseParser().feed(b"data: \xff\n\n")
    assert caught.value.code is Problem.INVALID_UTF8


def test_a_character_cut_by_the_end_of_the_stream_is_refused() -> None:
    parser = SseParser()
    parser.feed("data: \u00e9".encode()[:-1])
    with pytest.raises(SseError):
        parser.close()


def test_only_the_first_bom_is_dropped() -> None:
    assert SseParser().feed("\ufeff\ufeffdata: a\n\n".encode()) == []
    assert SseParser().feed("\ufeffdata: a\n\n".encode()) == [SseEvent("message", "a")]
