"""Tests for sandgate.policy.protocols.json_strict: one reading of a JSON body, or a refusal
that names why (the hostile inputs of issue 26: duplicate keys, comments, NaN, BOM, depth)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy.protocols.errors import JsonError, Problem
from sandgate.policy.protocols.json_strict import JsonLimits, loads_strict, nesting_depth

PROPERTY = settings(max_examples=300, deadline=None)

REFUSED = [
    (b'{"name": "a", "name": "b"}', Problem.DUPLICATE_KEY, "a key twice is refused"),
    (
        b'{"p": {"x": 1, "y": {"name": 1, "name": 2}}}',
        Problem.DUPLICATE_KEY,
        "a nested duplicate key is refused",
    ),
    (b'[{"a": 1}, {"b": 1, "b": 1}]', Problem.DUPLICATE_KEY, "a duplicate key inside an array is refused"),
    (b'{"a": 1} // note', Problem.NOT_JSON, "a line comment is refused"),
    (b'{"a": /* x */ 1}', Problem.NOT_JSON, "a block comment is refused"),
    (b'{"a": NaN}', Problem.NOT_FINITE, "NaN is refused"),
    (b'{"a": Infinity}', Problem.NOT_FINITE, "Infinity is refused"),
    (b'{"a": -Infinity}', Problem.NOT_FINITE, "minus Infinity is refused"),
    (b'{"a": 1e400}', Problem.NOT_FINITE, "a number too large for a float is refused"),
    (b'\xef\xbb\xbf{"a": 1}', Problem.BOM, "a UTF-8 byte order mark is refused"),
    (b'{"a": "\xff"}', Problem.INVALID_UTF8, "invalid UTF-8 is refused"),
    (b'{"a": "\xed\xa0\x80"}', Problem.INVALID_UTF8, "an encoded surrogate is refused"),
    (b'{"a": "\\ud800"}', Problem.UNPAIRED_SURROGATE, "an escaped lone high surrogate is refused"),
    (
        b'{"a": ["\\udc00"]}',
        Problem.UNPAIRED_SURROGATE,
        "an escaped lone low surrogate in an array is refused",
    ),
    (b'{"\\ud800": 1}', Problem.UNPAIRED_SURROGATE, "a lone surrogate in a key is refused"),
    (b'{"a": 1} {"b": 2}', Problem.NOT_JSON, "a second value is refused"),
    (b'{"a": 1}x', Problem.NOT_JSON, "trailing garbage is refused"),
    (b"{'a': 1}", Problem.NOT_JSON, "single quotes are refused"),
    (b'{"a": 1,}', Problem.NOT_JSON, "a trailing comma is refused"),
    (b"", Problem.NOT_JSON, "an empty body is refused"),
    (b'{"a": "x\ny"}', Problem.NOT_JSON, "a raw newline inside a string is refused"),
    (b"1" * 5000, Problem.NOT_JSON, "an integer past the digit limit is refused"),
]


@pytest.mark.parametrize(("body", "code"), [c[:2] for c in REFUSED], ids=[c[2] for c in REFUSED])
def test_refused(body: bytes, code: Problem) -> None:
    with pytest.raises(JsonError) as caught:
        loads_strict(body)
    assert caught.value.code is code


ACCEPTED = [
    (b'{"a": [1, 2.5, "x", true, null]}', {"a": [1, 2.5, "x", True, None]}, "ordinary json is read"),
    (b' \n{"a": 1}\r\n ', {"a": 1}, "surrounding whitespace is json"),
    (b'{"a": "\\ud83d\\ude00"}', {"a": "\U0001f600"}, "an escaped surrogate pair is one character"),
    (b'{"a": "]]]}}}"}', {"a": "]]]}}}"}, "brackets inside strings are not nesting"),
    (b'{"a": "\\"[[["}', {"a": '"[[['}, "an escaped quote does not end a string"),
    ('{"a": "é"}', {"a": "é"}, "a str body is read as UTF-8"),
    (b"[]", [], "an empty array is json"),
]


@pytest.mark.parametrize(("body", "expected"), [c[:2] for c in ACCEPTED], ids=[c[2] for c in ACCEPTED])
def test_accepted(body: bytes | str, expected: object) -> None:
    assert loads_strict(body) == expected


def test_a_body_over_the_size_limit_is_refused_before_parsing() -> None:
    with pytest.raises(JsonError) as caught:
        loads_strict(b"[" + b"0," * 100 + b"0]", JsonLimits(max_bytes=100))
    assert caught.value.code is Problem.TOO_LARGE


def test_depth_at_the_limit_is_read_and_one_more_is_refused() -> None:
    limits = JsonLimits(max_depth=8)
    assert loads_strict(b"[" * 8 + b"]" * 8, limits) is not None
    with pytest.raises(JsonError) as caught:
        loads_strict(b'{"a":' * 9 + b"1" + b"}" * 9, limits)
    assert caught.value.code is Problem.TOO_DEEP


def test_a_document_past_the_recursion_limit_is_refused_as_too_deep_not_a_crash() -> None:
    with pytest.raises(JsonError) as caught:
        loads_strict(b"[" * 200_000 + b"]" * 200_000, JsonLimits(max_bytes=1 << 20))
    assert caught.value.code is Problem.TOO_DEEP


def test_an_unclosed_deep_document_is_refused_cheaply() -> None:
    with pytest.raises(JsonError) as caught:
        loads_strict(b"[" * 100_000)
    assert caught.value.code is Problem.TOO_DEEP


def test_limits_refuse_a_depth_the_parser_could_not_reach() -> None:
    with pytest.raises(ValueError, match="max_depth"):
        JsonLimits(max_depth=5000)


def test_the_error_names_no_body_content_beyond_a_short_key() -> None:
    with pytest.raises(JsonError) as caught:
        loads_strict(b'{"' + b"k" * 500 + b'": 1, "' + b"k" * 500 + b'": 2}')
    assert len(str(caught.value)) < 120


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@PROPERTY
@given(json_values)
def test_any_json_the_standard_library_writes_is_read_back_the_same(value: object) -> None:
    assert loads_strict(json.dumps(value).encode()) == value


@PROPERTY
@given(json_values)
def test_the_depth_prescan_agrees_with_the_structure(value: object) -> None:
    def depth(v: object) -> int:
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0

    assert nesting_depth(json.dumps(value).encode()) == depth(value)
