"""Tests for sandgate.policy.protocols.arguments: predicates on nested tool arguments, failing
closed on missing paths and wrong shapes, with types compared strictly."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sandgate.policy.protocols.arguments import EACH, ArgumentPredicate, check_arguments, parse_path
from sandgate.policy.protocols.errors import JsonError, Problem
from sandgate.policy.protocols.json_strict import JsonLimits, loads_strict

ARGS: dict[str, Any] = {
    "repo": "octo/app",
    "owner": {"login": "octo", "id": 7},
    "items": [{"path": "/src/a.py"}, {"path": "/src/b.py"}],
    "labels": ["bug", "ui"],
    "count": 5,
    "ratio": 0.5,
    "draft": True,
    "title": "x" * 10,
    "empty": [],
    "nothing": None,
}


def pred(**fields: Any) -> ArgumentPredicate:
    return ArgumentPredicate.model_validate(fields)


CASES = [
    ({"path": "repo", "equals": "octo/app"}, None, "equals passes on the same string"),
    ({"path": "repo", "equals": "Octo/App"}, "is not the required value", "equals is case-sensitive"),
    ({"path": "owner.login", "equals": "octo"}, None, "a dotted path reaches a nested key"),
    ({"path": "owner.id", "equals": 7.0}, None, "an int equals the same float"),
    ({"path": "draft", "equals": 1}, "is not the required value", "true does not equal 1"),
    ({"path": "count", "equals": True}, "is not the required value", "5 does not equal true"),
    ({"path": "owner.id", "equals": "7"}, "is not the required value", "7 does not equal the string 7"),
    ({"path": "nothing", "equals": None}, None, "equals null passes on null"),
    ({"path": "repo", "one_of": ["octo/docs", "octo/app"]}, None, "one_of passes on a listed value"),
    ({"path": "repo", "one_of": ["octo/docs"]}, "is not an allowed value", "one_of fails on another value"),
    ({"path": "labels[*]", "one_of": ["bug", "ui"]}, None, "every element listed passes"),
    ({"path": "labels[*]", "one_of": ["bug"]}, "is not an allowed value", "one element not listed fails"),
    ({"path": "empty[*]", "one_of": ["bug"]}, None, "an empty array passes an each predicate"),
    ({"path": "items[0].path", "prefix": "/src/"}, None, "an index reaches one element"),
    ({"path": "items[*].path", "glob": "/src/*.py"}, None, "a glob passes on every element"),
    ({"path": "items[*].path", "glob": "/src/a*"}, "does not match the glob", "a glob fails on one element"),
    ({"path": "repo", "regex": "octo/[a-z]+"}, None, "a regex matches the whole value"),
    ({"path": "repo", "regex": "octo"}, "does not match the regex", "a regex must match the whole value"),
    ({"path": "count", "regex": "5"}, "does not match the regex", "a regex never matches a number"),
    ({"path": "count", "min": 1, "max": 10}, None, "a number in range passes"),
    ({"path": "count", "max": 4}, "is above the maximum", "a number over max fails"),
    ({"path": "ratio", "min": 0.6}, "is below the minimum", "a number under min fails"),
    ({"path": "draft", "min": 0}, "is not a number", "a bool is not a number"),
    ({"path": "repo", "max": 10}, "is not a number", "a string is not a number"),
    ({"path": "title", "max_length": 10}, None, "a string at max_length passes"),
    ({"path": "title", "max_length": 9}, "is too long", "a string over max_length fails"),
    ({"path": "labels", "max_length": 1}, "is too long", "an array over max_length fails"),
    ({"path": "owner", "max_length": 5}, "is neither a string nor an array", "max_length on an object fails"),
    ({"path": "missing", "equals": "x"}, "is missing", "a missing path fails"),
    ({"path": "missing", "equals": "x", "optional": True}, None, "a missing optional path passes"),
    ({"path": "items[5].path", "prefix": "/"}, "is missing", "an index out of range is missing"),
    (
        {"path": "repo.name", "equals": "x", "optional": True},
        "is not an object where the path names a key",
        "a key into a string fails even when optional",
    ),
    (
        {"path": "owner[0]", "equals": "x"},
        "is not an array where the path indexes one",
        "an index into an object fails",
    ),
    ({"path": "repo", "prefix": "octo/"}, None, "a prefix passes"),
    (
        {"path": "count", "prefix": "5"},
        "does not start with the required prefix",
        "a prefix never matches a number",
    ),
]


@pytest.mark.parametrize(("fields", "why"), [c[:2] for c in CASES], ids=[c[2] for c in CASES])
def test_predicates(fields: dict[str, Any], why: str | None) -> None:
    failure = check_arguments([pred(**fields)], ARGS)
    assert (failure.why if failure else None) == why


def test_the_first_failing_predicate_is_named() -> None:
    predicates = [pred(path="repo", equals="octo/app"), pred(path="count", max=1), pred(path="x", equals=1)]
    failure = check_arguments(predicates, ARGS)
    assert failure is not None
    assert failure.index == 1
    assert failure.describe() == "count in [None, 1]: is above the maximum"


def test_a_denial_message_never_echoes_the_argument_value() -> None:
    failure = check_arguments([pred(path="token", prefix="ok")], {"token": "sk-secret-value"})
    assert failure is not None and "sk-secret" not in failure.describe()


@pytest.mark.parametrize(
    ("path", "steps"),
    [
        ("repo", ("repo",)),
        ("owner.login", ("owner", "login")),
        ("items[0]", ("items", 0)),
        ("labels[*]", ("labels", EACH)),
        ("a[*][2].b", ("a", EACH, 2, "b")),
    ],
)
def test_paths_parse_into_steps(path: str, steps: tuple[object, ...]) -> None:
    assert parse_path(path) == steps


INVALID = [
    ({"path": "repo"}, "exactly one test", "a predicate without a test is refused"),
    ({"path": "repo", "equals": "a", "prefix": "b"}, "exactly one test", "two tests are refused"),
    ({"path": "repo", "regex": "(a)\\1"}, "a backreference", "a backreference is refused, saying so"),
    ({"path": "repo", "regex": "(?=a)"}, "a lookaround", "lookahead is refused"),
    ({"path": "repo", "regex": "a" * 2000}, "at most 1024", "a regex over 1024 characters is refused"),
    ({"path": "repo", "regex": "a{1001}"}, "a repeat is at most", "a repeat over 1000 is refused"),
    ({"path": "repo", "regex": "(?:ab){e<=1}"}, "starts no repeat", "a fuzzy match is refused"),
    ({"path": "count", "min": True}, "min", "a bool bound is refused"),
    ({"path": "count", "min": 5, "max": 1}, "min is above max", "an empty range is refused"),
    ({"path": "a..b", "equals": 1}, "keys joined by", "an empty key is refused"),
    ({"path": "a[x]", "equals": 1}, "keys joined by", "a named index is refused"),
    ({"path": "a b", "equals": 1}, "keys joined by", "a space in a path is refused"),
    ({"path": "repo", "equals": "a", "color": "red"}, "Extra inputs", "an unknown field is refused"),
    ({"path": "repo", "equals": {"a": 1}}, "equals", "equals takes a scalar only"),
    ({"path": "repo", "max_length": -1}, "max_length", "a negative max_length is refused"),
]


@pytest.mark.parametrize(("fields", "message"), [c[:2] for c in INVALID], ids=[c[2] for c in INVALID])
def test_invalid_predicates_are_refused_at_load(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        pred(**fields)


def test_a_regex_is_compiled_once_at_load() -> None:
    predicate = pred(path="repo", regex="octo/.*")
    pattern = predicate._compiled.pattern
    check_arguments([predicate], ARGS)
    assert predicate._compiled.pattern is pattern is not None


def test_arguments_nested_past_the_depth_limit_never_reach_a_predicate() -> None:
    body = (
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments": {"a": '
        + b"[" * 80
        + b"]" * 80
        + b"}}}"
    )
    with pytest.raises(JsonError) as caught:
        loads_strict(body, JsonLimits(max_depth=64))
    assert caught.value.code is Problem.TOO_DEEP
