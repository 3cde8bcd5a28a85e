"""What a GraphQL request asks for: its operations, their root fields and cost. No I/O.

The query is parsed with graphql-core, bounded three ways before and while parsing: the
document's size, its nesting (a pre-scan of braces outside strings and comments, so the
recursive parser never meets Python's recursion limit) and its tokens (`max_tokens`).

Every operation of the document is reported, not only the one that will run: a rule
decides on all of them, so a mutation in a second operation cannot ride beside the query
that `operationName` names (servers disagree on operationName handling less often than they
agree, but nothing is lost by refusing). For each operation:

- `root_fields`: the field names at its root (sorted, each once), fragments spread there
  (named or inline) resolved; a field's name, never its alias (`x: deleteRepo` reports
  `deleteRepo`);
- `depth`, `aliases`, `fields`: counted over the operation with fragments expanded, the
  expansion bounded by `max_nodes` (a fragment spread twice in a fragment spread twice ...
  grows exponentially: over the bound it is refused, not counted);
- `introspection`: `__schema` or `__type` reached.

A request object holds `query`, `operationName`, `variables` and `extensions` (GraphQL over
HTTP) and nothing else: a server that also reads another member (`id`, `doc_id`, `documentId`:
stored documents by another name) could run what the gateway never saw.

The request's `introspection` is true when `__schema` or `__type` appears anywhere in the
document, used or not. A persisted query (`extensions.persistedQuery.sha256Hash` without a
`query`) is reported by its hash, with no operations; with a `query` too, the hash must be
the query's, or the request is refused (a server could run the stored query instead).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import NoReturn

from sandgate.policy.protocols.errors import GraphqlError, Problem
from sandgate.policy.protocols.graphql_model import (
    DEFAULT_GRAPHQL_LIMITS,
    INTROSPECTION_FIELDS,
    GraphqlLimits,
    GraphqlOperation,
    GraphqlRequest,
)
from sandgate.policy.protocols.json_strict import JsonValue

__all__ = [
    "DEFAULT_GRAPHQL_LIMITS",
    "INTROSPECTION_FIELDS",
    "REQUEST_MEMBERS",
    "GraphqlLimits",
    "GraphqlOperation",
    "GraphqlRequest",
    "read_graphql_body",
    "read_graphql_query",
]

# The members of a GraphQL-over-HTTP request object; any other is refused.
REQUEST_MEMBERS = frozenset({"query", "operationName", "variables", "extensions"})
_HEX64 = re.compile(r"[0-9a-f]{64}", re.ASCII)


def read_graphql_body(
    value: JsonValue, limits: GraphqlLimits = DEFAULT_GRAPHQL_LIMITS
) -> tuple[GraphqlRequest, ...]:
    """The requests of a parsed GraphQL-over-HTTP body (an object, or a batch of them)."""
    if isinstance(value, dict):
        return (_read_one(value, limits),)
    if not isinstance(value, list) or not value:
        _fail(Problem.NOT_JSON, "a GraphQL body is an object or a non-empty array of objects")
    if len(value) > limits.max_batch:
        _fail(Problem.BATCH_TOO_LARGE, f"{len(value)} requests in one batch, the limit is {limits.max_batch}")
    out = []
    for member in value:
        if not isinstance(member, dict):
            _fail(Problem.NOT_JSON, "a batch member is not an object")
        out.append(_read_one(member, limits))
    return tuple(out)


def _read_one(body: Mapping[str, JsonValue], limits: GraphqlLimits) -> GraphqlRequest:
    """One `{query, operationName, variables, extensions}` object."""
    if not body.keys() <= REQUEST_MEMBERS:
        _fail(Problem.GRAPHQL_SYNTAX, "a member other than query, operationName, variables and extensions")
    query, name = body.get("query"), body.get("operationName")
    if query is not None and not isinstance(query, str):
        _fail(Problem.GRAPHQL_SYNTAX, "'query' is not a string")
    if name is not None and not isinstance(name, str):
        _fail(Problem.GRAPHQL_SYNTAX, "'operationName' is not a string")
    if not isinstance(body.get("variables"), dict | None):
        _fail(Problem.GRAPHQL_SYNTAX, "'variables' is not an object")
    persisted = _persisted_hash(body.get("extensions"))
    if query is None:
        if persisted is None:
            _fail(Problem.NO_OPERATION, "neither a query nor a persisted query hash")
        return GraphqlRequest((), None, persisted)
    if persisted is not None and hashlib.sha256(query.encode("utf-8", "replace")).hexdigest() != persisted:
        _fail(Problem.PERSISTED_HASH_MISMATCH, "the persisted query hash is not the query's")
    request = read_graphql_query(query, name, limits)
    return GraphqlRequest(request.operations, request.selected, persisted, request.introspection)


def _persisted_hash(extensions: JsonValue) -> str | None:
    """`extensions.persistedQuery.sha256Hash`, lower-case hex, or None when absent."""
    if extensions is None:
        return None
    if not isinstance(extensions, dict):
        _fail(Problem.GRAPHQL_SYNTAX, "'extensions' is not an object")
    persisted = extensions.get("persistedQuery")
    if persisted is None:
        return None
    digest = persisted.get("sha256Hash") if isinstance(persisted, dict) else None
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        _fail(Problem.GRAPHQL_SYNTAX, "'persistedQuery.sha256Hash' is not 64 lower-case hex digits")
    return digest


def read_graphql_query(
    query: str, operation_name: str | None = None, limits: GraphqlLimits = DEFAULT_GRAPHQL_LIMITS
) -> GraphqlRequest:
    """Analyse one GraphQL document, or GraphqlError."""
    # Lazy: graphql-core (~0.14 s to import) loads only once a gateway meets a GraphQL body.
    from sandgate.policy.protocols.graphql_document import analyse_document

    return analyse_document(query, operation_name, limits)


def _fail(code: Problem, message: str) -> NoReturn:
    raise GraphqlError(code, message)
