"""Tests for sandgate.policy.protocols.graphql_ops: a request object holds GraphQL over HTTP's four
members and nothing else, so no stored document rides in under another name."""

from __future__ import annotations

import pytest

from sandgate.policy.protocols.decide import decide_graphql_body
from sandgate.policy.protocols.errors import GraphqlError, Problem
from sandgate.policy.protocols.graphql_ops import read_graphql_body
from sandgate.policy.protocols.rules import GraphqlSection
from sandgate.policy.reasons import Reason

VIEWER = "{ viewer { login } }"


@pytest.mark.parametrize(
    "member",
    ["id", "doc_id", "documentId", "queryId", "Query", "operationname"],
    ids=lambda m: f"a request with {m!r} beside its query is refused",
)
def test_a_member_other_than_the_four_is_refused(member: str) -> None:
    with pytest.raises(GraphqlError) as refused:
        read_graphql_body({"query": VIEWER, member: "stored-mutation"})
    assert refused.value.code is Problem.GRAPHQL_SYNTAX


def test_a_batch_member_with_an_unknown_member_refuses_the_body_as_invalid_request() -> None:
    body = b'[{"query": "{ viewer { login } }"}, {"query": "{ viewer { login } }", "doc_id": "1"}]'
    verdict, requests = decide_graphql_body(body, GraphqlSection())
    assert (verdict.reason, verdict.problem, requests) == (Reason.INVALID_REQUEST, Problem.GRAPHQL_SYNTAX, ())


def test_the_four_members_are_read() -> None:
    (request,) = read_graphql_body(
        {"query": "query V { viewer { login } }", "operationName": "V", "variables": {}, "extensions": {}}
    )
    assert request.selected is not None and request.selected.name == "V"
