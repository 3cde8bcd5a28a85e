"""Tests for sandgate.policy.protocols.graphql_ops: operations, root fields (never aliases),
costs with fragments expanded, introspection and persisted queries, within bounds."""

from __future__ import annotations

import hashlib

import pytest

from sandgate.policy.protocols.errors import GraphqlError, Problem
from sandgate.policy.protocols.graphql_ops import GraphqlLimits, read_graphql_body, read_graphql_query


def test_a_query_reports_its_type_name_root_fields_and_costs() -> None:
    request = read_graphql_query("query Q { viewer { login repos(first: 2) { name } } rateLimit { left } }")
    (op,) = request.operations
    assert request.selected is op
    assert (op.type, op.name, op.root_fields, op.depth, op.aliases, op.fields) == (
        "query",
        "Q",
        ("rateLimit", "viewer"),
        3,
        0,
        6,
    )
    assert not request.introspection


def test_an_alias_does_not_hide_the_mutation_field() -> None:
    (op,) = read_graphql_query("mutation { harmless: deleteRepository(id: 1) { id } }").operations
    assert (op.type, op.root_fields, op.aliases) == ("mutation", ("deleteRepository",), 1)


def test_a_mutation_in_a_second_operation_is_reported_beside_the_selected_query() -> None:
    request = read_graphql_query("query A { viewer { login } } mutation B { deleteRepository(id: 1) }", "A")
    assert request.selected is not None and request.selected.name == "A"
    assert [(op.type, op.root_fields) for op in request.operations] == [
        ("query", ("viewer",)),
        ("mutation", ("deleteRepository",)),
    ]


def test_root_fields_spread_from_fragments_are_resolved() -> None:
    query = """
    mutation M { ...Outer ... on Mutation { inline: addStar(id: 1) { id } } }
    fragment Outer on Mutation { ...Inner }
    fragment Inner on Mutation { deleteRepository(id: 1) { id } }
    """
    (op,) = read_graphql_query(query).operations
    assert op.root_fields == ("addStar", "deleteRepository")


def test_introspection_anywhere_in_the_document_is_reported() -> None:
    request = read_graphql_query(
        "query A { viewer { id } } fragment Unused on Query { __schema { types { name } } }"
    )
    assert request.introspection
    assert not request.operations[0].introspection


def test_nested_type_introspection_is_reported_on_the_operation() -> None:
    (op,) = read_graphql_query('{ viewer { x: __type(name: "User") { name } } }').operations
    assert op.introspection


def test_fragments_count_toward_depth_and_fields_each_time_they_are_spread() -> None:
    (op,) = read_graphql_query("{ a { ...F } b { ...F } } fragment F on T { x { y } }").operations
    assert (op.depth, op.fields) == (3, 6)


def test_a_persisted_query_without_text_is_reported_by_its_hash() -> None:
    digest = "a" * 64
    (request,) = read_graphql_body({"extensions": {"persistedQuery": {"version": 1, "sha256Hash": digest}}})
    assert (request.persisted_hash, request.operations, request.selected) == (digest, (), None)


def test_a_persisted_query_with_its_own_text_is_analysed() -> None:
    query = "{ viewer { id } }"
    digest = hashlib.sha256(query.encode()).hexdigest()
    (request,) = read_graphql_body({"query": query, "extensions": {"persistedQuery": {"sha256Hash": digest}}})
    assert request.persisted_hash == digest and request.operations[0].root_fields == ("viewer",)


def test_a_batch_body_reads_every_request() -> None:
    requests = read_graphql_body([{"query": "{ a }"}, {"query": "mutation { b }"}])
    assert [r.operations[0].type for r in requests] == ["query", "mutation"]


REFUSED = [
    ({"query": "{ a "}, Problem.GRAPHQL_SYNTAX, "a syntax error is refused"),
    (
        {"query": "query A { a } query B { b }"},
        Problem.AMBIGUOUS_OPERATION,
        "two operations without operationName are refused",
    ),
    (
        {"query": "{ a } mutation B { b }", "operationName": "B"},
        Problem.AMBIGUOUS_OPERATION,
        "an anonymous operation beside a named one is refused",
    ),
    (
        {"query": "query A { a } mutation A { b }", "operationName": "A"},
        Problem.AMBIGUOUS_OPERATION,
        "two operations with one name are refused",
    ),
    (
        {"query": "query A { a }", "operationName": "B"},
        Problem.NO_OPERATION,
        "an operationName naming nothing is refused",
    ),
    ({"query": "fragment F on T { a }"}, Problem.NO_OPERATION, "a document without operations is refused"),
    ({"query": "{ ...F }"}, Problem.UNKNOWN_FRAGMENT, "an unknown fragment is refused"),
    (
        {"query": "{ ...F } fragment F on T { ...G } fragment G on T { ...F }"},
        Problem.FRAGMENT_CYCLE,
        "a fragment cycle is refused",
    ),
    (
        {"query": "{ ...F } fragment F on T { a } fragment F on T { deleteRepository }"},
        Problem.GRAPHQL_SYNTAX,
        "a fragment defined twice is refused",
    ),
    ({"query": "type Query { a: Int }"}, Problem.GRAPHQL_SYNTAX, "a schema definition is refused"),
    ({"query": 5}, Problem.GRAPHQL_SYNTAX, "a query that is not a string is refused"),
    (
        {"query": "{ a }", "variables": [1]},
        Problem.GRAPHQL_SYNTAX,
        "variables that are not an object are refused",
    ),
    ({}, Problem.NO_OPERATION, "a body with neither query nor persisted hash is refused"),
    (
        {"extensions": {"persistedQuery": {"sha256Hash": "xyz"}}},
        Problem.GRAPHQL_SYNTAX,
        "a malformed persisted hash is refused",
    ),
    (
        {"query": "{ viewer { id } }", "extensions": {"persistedQuery": {"sha256Hash": "b" * 64}}},
        Problem.PERSISTED_HASH_MISMATCH,
        "a persisted hash that is not the query's is refused",
    ),
]


@pytest.mark.parametrize(("body", "code"), [c[:2] for c in REFUSED], ids=[c[2] for c in REFUSED])
def test_refused(body: dict[str, object], code: Problem) -> None:
    with pytest.raises(GraphqlError) as caught:
        read_graphql_body(body)  # type: ignore[arg-type]
    assert caught.value.code is code


def test_a_query_over_the_size_limit_is_refused() -> None:
    with pytest.raises(GraphqlError) as caught:
        read_graphql_query("{ " + "a " * 100 + "}", limits=GraphqlLimits(max_bytes=50))
    assert caught.value.code is Problem.TOO_LARGE


def test_a_query_over_the_token_limit_is_refused() -> None:
    with pytest.raises(GraphqlError) as caught:
        read_graphql_query("{ " + "a " * 100 + "}", limits=GraphqlLimits(max_tokens=50))
    assert caught.value.code is Problem.TOO_MANY_TOKENS


def test_deep_nesting_is_refused_before_the_recursive_parser() -> None:
    with pytest.raises(GraphqlError) as caught:
        read_graphql_query(
            "{ a " * 5000 + "}" * 5000, limits=GraphqlLimits(max_bytes=1 << 20, max_tokens=1 << 20)
        )
    assert caught.value.code is Problem.TOO_DEEP


def test_braces_inside_strings_and_comments_are_not_nesting() -> None:
    query = '{ a(x: "{{{{{{{{{{", y: """ {{{{{{{{{{ """) # {{{{{{{{{{\n }'
    (op,) = read_graphql_query(query, limits=GraphqlLimits(max_nesting=3)).operations
    assert op.root_fields == ("a",)


def test_exponential_fragment_expansion_is_refused_within_the_node_bound() -> None:
    fragments = " ".join(
        f"fragment F{i} on T {{ a: x {{ ...F{i + 1} }} b: x {{ ...F{i + 1} }} }}" for i in range(30)
    )
    query = "{ ...F0 } " + fragments + " fragment F30 on T { leaf }"
    with pytest.raises(GraphqlError) as caught:
        read_graphql_query(query)
    assert caught.value.code is Problem.TOO_COMPLEX
