"""End to end: GraphQL requests through a real `sandgate run` to a real GraphQL server (graphql-core's
executor behind a Starlette app, served by uvicorn, with Apollo-style automatic persisted queries).

A rule's `graphql:` section decides every request: queries pass and run; a mutation (even
behind an alias, in a second operation of the document, in a batch, or as a persisted-query id
the rule does not list), introspection, and a document over the depth, alias or field limits
are answered with GraphQL `errors` in an HTTP 200 and never reach the server; each exchange's
one audit record carries the `graphql` object. The server counts what it executed, so a
refused mutation that ran anyway fails the test."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import uvicorn
from conftest import UPSTREAM_IP, GatewayFactory, RunningGateway, tenant_yaml
from graphql import build_schema, graphql_sync
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from support.ports import free_port

pytestmark = pytest.mark.slow

SDL = """
type Query { viewer: User! }
type User { login: String!  repositories: [Repository!]! }
type Repository { name: String!  owner: User! }
type Mutation { deleteRepository(name: String!): Boolean!  addStar(name: String!): Boolean! }
"""
VIEWER = "query Viewer { viewer { login } }"
DELETE = 'mutation Delete { deleteRepository(name: "api") }'


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _persisted(digest: str) -> dict[str, Any]:
    return {"extensions": {"persistedQuery": {"version": 1, "sha256Hash": digest}}}


class GraphqlServer:
    """A GraphQL server whose store already holds VIEWER and DELETE by their sha256 (APQ), and
    which records every mutation field it executed."""

    def __init__(self) -> None:
        self.schema = build_schema(SDL)
        self.stored = {_sha(VIEWER): VIEWER, _sha(DELETE): DELETE}
        self.mutations: list[str] = []
        user: dict[str, Any] = {"login": "octo"}
        user["repositories"] = lambda *_: [{"name": "api", "owner": user}]
        self.root = {
            "viewer": lambda *_: user,
            "deleteRepository": lambda *_, **kw: self._ran("deleteRepository"),
            "addStar": lambda *_, **kw: self._ran("addStar"),
        }

    def _ran(self, field: str) -> bool:
        self.mutations.append(field)
        return True

    def execute(self, body: Any) -> Any:
        if isinstance(body, list):
            return [self.execute(member) for member in body]
        query = body.get("query")
        digest = ((body.get("extensions") or {}).get("persistedQuery") or {}).get("sha256Hash")
        if query is None and digest is not None:
            query = self.stored.get(digest)
            if query is None:
                return {"errors": [{"message": "PersistedQueryNotFound"}]}
        result = graphql_sync(
            self.schema,
            query or "",
            root_value=self.root,
            variable_values=body.get("variables"),
            operation_name=body.get("operationName"),
        )
        return result.formatted

    async def endpoint(self, request: Request) -> JSONResponse:
        if request.method == "GET":
            params = dict(urllib.parse.parse_qsl(request.url.query))
            body: Any = {
                k: json.loads(v) if k in ("variables", "extensions") else v for k, v in params.items()
            }
        else:
            body = json.loads(await request.body())
        return JSONResponse(self.execute(body))


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[GraphqlServer, int]]:
    graphql_server = GraphqlServer()
    app = Starlette(routes=[Route("/graphql", graphql_server.endpoint, methods=["GET", "POST"])])
    port = free_port(UPSTREAM_IP)
    runner = uvicorn.Server(uvicorn.Config(app, host=UPSTREAM_IP, port=port, log_level="warning"))
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not runner.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError("the GraphQL server did not start")
        time.sleep(0.05)
    yield graphql_server, port
    runner.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def gateway(start_module_gateway: GatewayFactory, server: tuple[GraphqlServer, int]) -> RunningGateway:
    port = server[1]
    limits = {"max_depth": 4, "max_aliases": 2, "max_fields": 12}
    rules = [
        # api.test: queries only (the default), one persisted query listed.
        {
            "id": "gql",
            "hosts": ["api.test"],
            "ports": [port],
            "paths": ["/graphql"],
            "graphql": {"persisted_queries": [_sha(VIEWER)], **limits},
        },
        # x.api.test: mutations too, but never deleteRepository.
        {
            "id": "gql-write",
            "hosts": ["x.api.test"],
            "ports": [port],
            "paths": ["/graphql"],
            "graphql": {
                "operation_types": ["query", "mutation"],
                "root_fields": {"deny": ["deleteRepository"]},
            },
        },
    ]
    return start_module_gateway({"t1.yaml": tenant_yaml("t1", rules)})


@pytest.fixture
def gw(gateway: RunningGateway, server: tuple[GraphqlServer, int]) -> RunningGateway:
    gateway.mark()
    server[0].mutations.clear()
    return gateway


def _post(gw: RunningGateway, port: int, body: Any, host: str = "api.test") -> httpx2.Response:
    with httpx2.Client(proxy=gw.proxy(), timeout=10) as client:
        return client.post(f"http://{host}:{port}/graphql", json=body)


def _get(gw: RunningGateway, port: int, query: str, host: str = "api.test") -> httpx2.Response:
    with httpx2.Client(proxy=gw.proxy(), timeout=10) as client:
        return client.get(f"http://{host}:{port}/graphql?{query}")


FIVE_DEEP = "{ viewer { repositories { owner { repositories { name } } } } }"
THREE_ALIASES = "{ a: viewer { login } b: viewer { login } c: viewer { login } }"
THIRTEEN_FIELDS = "{ viewer { ...F ...F ...F ...F } } fragment F on User { login repositories { name } }"


@pytest.mark.parametrize(
    ("host", "body", "reason", "rule"),
    [
        ("api.test", {"query": DELETE}, "operation_not_allowed", "graphql.operation_types"),
        (
            "x.api.test",
            {"query": 'mutation { star: addStar(name: "a") harmless: deleteRepository(name: "api") }'},
            "field_not_allowed",
            "graphql.root_fields.deny[0]",
        ),
        (
            "api.test",
            {"query": f"{VIEWER} {DELETE}", "operationName": "Viewer"},
            "operation_not_allowed",
            "graphql.operation_types",
        ),
        ("api.test", _persisted(_sha(DELETE)), "persisted_query_unknown", None),
        ("api.test", {"query": "{ __schema { types { name } } }"}, "introspection_not_allowed", None),
        ("api.test", {"query": FIVE_DEEP}, "query_too_complex", "graphql.max_depth"),
        ("api.test", {"query": THREE_ALIASES}, "query_too_complex", "graphql.max_aliases"),
        ("api.test", {"query": THIRTEEN_FIELDS}, "query_too_complex", "graphql.max_fields"),
        ("api.test", {"query": VIEWER, "documentId": _sha(DELETE)}, "invalid_request", None),
    ],
    ids=[
        "a mutation is refused where the rule allows queries only",
        "a denied mutation field behind an alias is refused by its name",
        "a mutation in a second operation is refused beside the query operationName picks",
        "a persisted-query id the rule does not list is refused though the server stores it",
        "introspection is refused unless the rule turns it on",
        "a document nested past max_depth is refused",
        "a document with more aliases than max_aliases is refused",
        "a document over max_fields once its fragments are expanded is refused",
        "a stored document named by another member than query is refused",
    ],
)
def test_a_refused_request_is_a_graphql_error_and_never_reaches_the_server(
    gw: RunningGateway,
    server: tuple[GraphqlServer, int],
    host: str,
    body: dict[str, Any],
    reason: str,
    rule: str | None,
) -> None:
    graphql_server, port = server
    response = _post(gw, port, body, host)
    assert response.status_code == 200 and response.headers["X-Sandgate-Reason"] == reason
    answer = response.json()
    assert "data" not in answer
    (error,) = answer["errors"]
    assert (error["extensions"]["reason"], error["extensions"]["rule"]) == (reason, rule)
    assert graphql_server.mutations == []
    (record,) = gw.records(1)
    assert (record["decision"], record["reason"], record["status"]) == ("deny", reason, 200)
    assert record["decision_id"] == response.headers["X-Sandgate-Decision-Id"]
    assert (record["graphql"]["verdict"], record["graphql"]["reason"], record["graphql"]["rule"]) == (
        "deny",
        reason,
        rule,
    )
    assert "Traceback" not in gw.log()


def test_a_refused_request_is_recorded_with_its_operations_and_never_its_variables(
    gw: RunningGateway, server: tuple[GraphqlServer, int]
) -> None:
    port = server[1]
    body = {"query": f"{VIEWER} {DELETE}", "operationName": "Viewer", "variables": {"token": "s3cret-value"}}
    _post(gw, port, body)
    (record,) = gw.records(1)
    (request,) = record["graphql"]["requests"]
    assert request["operations"] == [
        {"type": "query", "name": "Viewer", "root_fields": ["viewer"]},
        {"type": "mutation", "name": "Delete", "root_fields": ["deleteRepository"]},
    ]
    assert "s3cret-value" not in gw.audit_path.read_text()


def test_queries_and_listed_persisted_queries_run_and_are_recorded_as_allowed(
    gw: RunningGateway, server: tuple[GraphqlServer, int]
) -> None:
    graphql_server, port = server
    plain = _post(gw, port, {"query": VIEWER})
    persisted = _post(gw, port, _persisted(_sha(VIEWER)))
    starred = _post(gw, port, {"query": 'mutation { addStar(name: "api") }'}, host="x.api.test")
    assert plain.json() == persisted.json() == {"data": {"viewer": {"login": "octo"}}}
    assert starred.json() == {"data": {"addStar": True}}
    assert graphql_server.mutations == ["addStar"]
    records = gw.records(3)
    assert [(r["decision"], r["graphql"]["verdict"]) for r in records] == [("allow", "allow")] * 3
    assert records[1]["graphql"]["requests"][0]["persisted_sha256"] == _sha(VIEWER)
    assert records[1]["graphql"]["rule"] == "graphql.persisted_queries[0]"


def test_a_batch_with_one_mutation_is_refused_whole_each_request_answered(
    gw: RunningGateway, server: tuple[GraphqlServer, int]
) -> None:
    graphql_server, port = server
    response = _post(gw, port, [{"query": VIEWER}, {"query": DELETE}, _persisted(_sha(VIEWER))])
    answers = response.json()
    assert [a["errors"][0]["extensions"]["reason"] for a in answers] == [
        "batch_refused",
        "operation_not_allowed",
        "batch_refused",
    ]
    assert graphql_server.mutations == []
    (record,) = gw.records(1)
    assert (record["reason"], record["graphql"]["batch"]) == ("operation_not_allowed", 3)
    assert [r["verdict"] for r in record["graphql"]["requests"]] == ["deny"] * 3


def test_graphql_over_get_is_decided_like_its_body_and_never_runs_a_mutation(
    gw: RunningGateway, server: tuple[GraphqlServer, int]
) -> None:
    """GraphQL over HTTP's GET (`query`, `operationName`, `variables`, `extensions`)."""
    graphql_server, port = server
    query = urllib.parse.urlencode({"query": VIEWER, "variables": "{}"})
    allowed = _get(gw, port, query)
    assert allowed.json() == {"data": {"viewer": {"login": "octo"}}}
    # The rule for x.api.test allows mutations: never over GET.
    star = _get(gw, port, urllib.parse.urlencode({"query": 'mutation { addStar(name: "a") }'}), "x.api.test")
    twice = _get(gw, port, f"query={urllib.parse.quote(VIEWER)}&query={urllib.parse.quote(DELETE)}")
    loose = _get(gw, port, urllib.parse.urlencode({"query": VIEWER, "variables": "{'a': 1}"}))
    persisted = _get(
        gw, port, urllib.parse.urlencode({"extensions": json.dumps(_persisted(_sha(DELETE))["extensions"])})
    )
    reasons = [r.json()["errors"][0]["extensions"]["reason"] for r in (star, twice, loose, persisted)]
    assert reasons == [
        "operation_not_allowed",
        "invalid_request",
        "invalid_request",
        "persisted_query_unknown",
    ]
    assert graphql_server.mutations == []
    records = gw.records(5)
    assert [r["reason"] for r in records] == ["allowed", *reasons]
    assert records[0]["graphql"]["requests"][0]["operations"][0]["name"] == "Viewer"
