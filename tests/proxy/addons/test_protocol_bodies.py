"""Tests for sandgate.proxy.addons.protocol_bodies: a GraphQL GET's query string read strictly into
the body the decider reads, decided like that body, and never a mutation; answers per protocol."""

from __future__ import annotations

import hashlib
import json
import urllib.parse

import pytest

from sandgate.policy.protocols.decide import Verdict
from sandgate.policy.protocols.errors import Problem
from sandgate.policy.protocols.rules import GraphqlSection, JsonRpcSection
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.protocol_bodies import (
    Unreadable,
    decide_body,
    decide_graphql_get,
    graphql_get_body,
    protocol_answer,
)

VIEWER = "query Viewer { viewer { login } }"
LISTED = hashlib.sha256(VIEWER.encode()).hexdigest()


def _qs(**params: str) -> str:
    return urllib.parse.urlencode(params)


def _ext(digest: str) -> str:
    return json.dumps({"persistedQuery": {"version": 1, "sha256Hash": digest}})


def test_the_four_parameters_become_the_json_body_with_json_values_parsed() -> None:
    query = _qs(
        query=VIEWER,
        operationName="Viewer",
        variables='{"first": 2, "after": null}',
        extensions='{"persistedQuery": {"version": 1, "sha256Hash": "' + LISTED + '"}}',
    )
    assert json.loads(graphql_get_body(query)) == {
        "query": VIEWER,
        "operationName": "Viewer",
        "variables": {"first": 2, "after": None},
        "extensions": {"persistedQuery": {"version": 1, "sha256Hash": LISTED}},
    }


def test_form_encoding_is_undone_plus_as_space_and_percent_escapes_as_utf8() -> None:
    assert json.loads(graphql_get_body("query=%7B+viewer+%7B+login+%7D+%7D&operationName=%C3%A9")) == {
        "query": "{ viewer { login } }",
        "operationName": "é",
    }


@pytest.mark.parametrize(
    ("query_string", "problem"),
    [
        (_qs(query=VIEWER) + "&" + _qs(query="mutation { deleteRepository(id: 1) }"), None),
        (_qs(query=VIEWER, variables="{}") + "&variables=%7B%7D", None),
        (_qs(query=VIEWER, id="1"), None),
        (_qs(Query=VIEWER), None),
        (_qs(operationname="Viewer", query=VIEWER), None),
        ("query", None),
        ("query=%7Bx%7D&&operationName=x", None),
        ("query=%ff", Problem.INVALID_UTF8),
        (_qs(query=VIEWER, variables="{'first': 2}"), Problem.NOT_JSON),
        (_qs(query=VIEWER, variables='{"a": 1, "a": 2}'), Problem.DUPLICATE_KEY),
        (_qs(query=VIEWER, variables='{"a": NaN}'), Problem.NOT_FINITE),
        (_qs(query=VIEWER, variables=""), Problem.NOT_JSON),
        (_qs(query=VIEWER, extensions="[" * 100 + "]" * 100), Problem.TOO_DEEP),
        ("a=1&b=2&c=3&d=4&e=5", None),
    ],
    ids=[
        "a repeated query is refused (which one would the server run?)",
        "a repeated variables is refused",
        "a parameter GraphQL over HTTP does not define is refused",
        "a parameter of ours in another case is refused",
        "operationName spelled in lower case is refused",
        "a parameter without a value is refused",
        "an empty pair between two ampersands is refused",
        "a percent escape that is not UTF-8 is refused",
        "variables in single quotes are not JSON",
        "variables with a duplicate key are refused",
        "variables with NaN are refused",
        "empty variables are not JSON",
        "extensions nested past the JSON depth are refused",
        "more than four parameters are refused before they are read",
    ],
)
def test_a_query_string_that_is_not_strictly_graphql_over_http_is_unreadable(
    query_string: str, problem: Problem | None
) -> None:
    with pytest.raises(Unreadable) as refused:
        graphql_get_body(query_string)
    assert refused.value.problem == problem
    assert VIEWER not in str(refused.value), "the detail never quotes the query string"


def test_a_query_string_over_the_body_bound_is_too_large() -> None:
    with pytest.raises(Unreadable) as refused:
        graphql_get_body("query=" + "a" * (1 << 20))
    assert refused.value.problem is Problem.TOO_LARGE


@pytest.mark.parametrize(
    ("section", "query_string", "reason", "read"),
    [
        (GraphqlSection(), _qs(query=VIEWER), Reason.ALLOWED, True),
        (
            GraphqlSection(operation_types=["query", "mutation"]),
            _qs(query="mutation { addStar(id: 1) }"),
            "operation_not_allowed",
            True,
        ),
        (
            GraphqlSection(operation_types=["query", "mutation"]),
            _qs(query=VIEWER + " mutation M { addStar(id: 1) }", operationName="Viewer"),
            "operation_not_allowed",
            True,
        ),
        (
            GraphqlSection(operation_types=["query", "subscription"]),
            _qs(query="subscription { starred { id } }"),
            "operation_not_allowed",
            True,
        ),
        (GraphqlSection(), _qs(query="mutation { addStar(id: 1) }"), "operation_not_allowed", True),
        (GraphqlSection(persisted_queries=[LISTED]), _qs(extensions=_ext(LISTED)), Reason.ALLOWED, True),
        (GraphqlSection(), _qs(extensions=_ext("e" * 64)), "persisted_query_unknown", True),
        (GraphqlSection(), _qs(query=VIEWER) + "&query=x", Reason.INVALID_REQUEST, False),
    ],
    ids=[
        "a query over GET is decided like its body and allowed",
        "a mutation over GET is refused where the rule allows mutations",
        "a mutation in a second operation over GET is refused",
        "a subscription over GET is refused",
        "a mutation over GET where the rule allows queries only is refused by the rule",
        "a listed persisted query over GET is allowed",
        "an unlisted persisted-query id over GET is refused",
        "a repeated parameter is invalid_request, nothing read",
    ],
)
def test_a_graphql_get_is_decided_as_its_body_and_runs_only_queries(
    section: GraphqlSection, query_string: str, reason: str, read: bool
) -> None:
    verdict, body = decide_graphql_get(section, query_string)
    assert str(verdict.reason) == str(reason)
    assert verdict.allowed is (reason == Reason.ALLOWED)
    assert (body is not None) is read
    if not verdict.allowed:
        (answer_error,) = _errors(protocol_answer(section, verdict))
        assert answer_error["extensions"]["reason"] == str(reason)


def _errors(answer: object) -> list[dict[str, dict[str, object]]]:
    assert isinstance(answer, dict)
    errors = answer["errors"]
    assert isinstance(errors, list)
    return errors


def test_the_get_refusal_names_the_request_it_refused_for_the_record() -> None:
    section = GraphqlSection(operation_types=["query", "mutation"])
    verdict, _ = decide_graphql_get(section, _qs(query="mutation Star { addStar(id: 1) }"))
    assert verdict.verdict is Verdict.DENY and "GET" in verdict.detail
    (message,) = verdict.messages
    assert (message.index, message.verdict) == (0, Verdict.DENY)


def test_a_jsonrpc_refusal_answers_in_jsonrpc_and_only_notifications_get_nothing() -> None:
    section = JsonRpcSection.model_validate({"methods": {"allow": ["eth_*"]}})
    verdict, _ = decide_body(section, b'{"jsonrpc":"2.0","id":7,"method":"admin_peers"}', None)
    answer = protocol_answer(section, verdict)
    assert isinstance(answer, dict) and answer["id"] == 7
    notified, _ = decide_body(section, b'{"jsonrpc":"2.0","method":"admin_peers"}', None)
    assert not notified.allowed and protocol_answer(section, notified) is None
