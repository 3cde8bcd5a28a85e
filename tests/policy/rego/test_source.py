"""Tests for sandgate.policy.rego.source: what a scan of Rego text finds without running it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandgate.policy.rego.source import (
    line_column,
    merge_paths,
    module_facts,
    package_ref,
    ref_text,
)


def paths_of(body: str) -> object:
    return module_facts("package p\nimport rego.v1\n" + body).input_paths


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('x if input.request.method == "GET"', {("request", "method")}),
        ('x if input["dest"]["host"] == "a"', {("dest", "host")}),
        ('x if input.request.headers["x-api-key"]', {("request", "headers", "x-api-key")}),
        ("x if input.request.headers[k]", {("request", "headers")}),
        ("x if { r := input.request; r.method }", {("request",)}),
        ("x if { input.request.method; input.request }", {("request",)}),
        ("x := input", None),
        ("x if f(input)", None),
        ("x if input[k]", None),
        ("import input.request as req\nx if req.method", {("request",)}),
        ('# input.comment\nx if "input.string" == input.phase', {("phase",)}),
        ("x if { y := {`input`: 1}; input.tenant }", {("tenant",)}),
        ("x if data.p.input.other", set()),
    ],
    ids=[
        "a dotted path is read as that field",
        "bracketed string keys are fields too",
        "a header named by a string is one field",
        "a computed index reads the whole object at that level",
        "a bare prefix reads its whole subtree and absorbs longer paths",
        "a shorter path absorbs a longer one",
        "the whole input assigned means every field",
        "the whole input passed to a function means every field",
        "a computed top-level index means every field",
        "an import of part of the input reads that subtree",
        "comments and strings are not references",
        "raw strings are not references",
        "a field named input elsewhere is not the input",
    ],
)
def test_input_paths(body: str, expected: set[tuple[str, ...]] | None) -> None:
    found = paths_of(body)
    assert found == (frozenset(expected) if expected is not None else None)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("package sandgate\n", ("sandgate",)),
        ("# c\npackage sandgate.tenants.acme\n", ("sandgate", "tenants", "acme")),
        ('package sandgate.tenants["demo-1"]\n', ("sandgate", "tenants", "demo-1")),
        ("import rego.v1\n", None),
    ],
    ids=["a simple package", "after a comment", "a string part", "no package"],
)
def test_package_ref(source: str, expected: tuple[str, ...] | None) -> None:
    assert package_ref(source) == expected


@pytest.mark.parametrize(
    ("path", "text"),
    [
        (("sandgate",), "sandgate"),
        (("sandgate", "tenants", "acme"), "sandgate.tenants.acme"),
        (("sandgate", "tenants", "demo-1"), 'sandgate.tenants["demo-1"]'),
    ],
    ids=["one part", "identifiers", "a name that is not an identifier is quoted"],
)
def test_ref_text(path: tuple[str, ...], text: str) -> None:
    assert ref_text(path) == text
    assert package_ref(f"package {text}\n") == path


def test_builtins_that_change_between_calls_are_found() -> None:
    facts = module_facts("package p\nimport rego.v1\nlate if time.clock(time.now_ns())[0] > 18\n")
    assert facts.builtins == {"time.now_ns"}
    assert facts.forbidden == ()


@pytest.mark.parametrize(
    "call",
    [
        'io.jwt.decode_verify(input.request.headers.authorization, {"secret": "s"})',
        "crypto.x509.parse_and_verify_certificates(x)",
        'rand.intn("k", 10)',
    ],
    ids=["JWT verification reads the clock", "certificate verification reads the clock", "random numbers"],
)
def test_more_builtins_that_change_between_calls(call: str) -> None:
    facts = module_facts(f"package p\nimport rego.v1\nx := {call}\n")
    assert facts.builtins and facts.forbidden == ()


def test_a_template_string_reads_anything() -> None:
    assert paths_of('x := $"{input.request.method}" if input.phase') is None


def test_network_builtins_are_forbidden_with_their_position() -> None:
    text = 'package p\nimport rego.v1\n\nx := http.send({"url": "http://a"})\n'
    facts = module_facts(text)
    ((name, offset),) = facts.forbidden
    assert name == "http.send"
    assert line_column(text, offset) == (4, 6)


def test_test_rules_are_top_level_rules_named_test_() -> None:
    text = "package p_test\nimport rego.v1\ntest_a if true\n\ntest_b if {\n  test_c := 1\n  test_c == 1\n}\ntest_a if false\n"
    assert module_facts(text).tests == ("test_a", "test_b")


def test_merge_paths_is_a_union_where_none_absorbs_everything() -> None:
    a = frozenset({("request", "method")})
    b = frozenset({("request",), ("dest", "host")})
    assert merge_paths([a, b]) == frozenset({("request",), ("dest", "host")})
    assert merge_paths([a, None]) is None
    assert merge_paths([]) == frozenset()


@given(st.text(alphabet='input.[]"`#{}() \nabcxyz_-=', max_size=80))
def test_the_scan_never_fails_on_any_text(text: str) -> None:
    facts = module_facts(text)
    assert facts.input_paths is None or all(isinstance(p, tuple) for p in facts.input_paths)
