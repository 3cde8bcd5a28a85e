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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import NoReturn

from graphql import GraphQLError, parse
from graphql.language import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
)

from sandgate.policy.protocols.errors import GraphqlError, Problem
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

INTROSPECTION_FIELDS = frozenset({"__schema", "__type"})
# The members of a GraphQL-over-HTTP request object; any other is refused.
REQUEST_MEMBERS = frozenset({"query", "operationName", "variables", "extensions"})
_HEX64 = re.compile(r"[0-9a-f]{64}", re.ASCII)
# Block strings, strings and comments: skipped by the nesting pre-scan.
_NOT_CODE = re.compile(r'"""(?:[^"\\]|\\.|"(?!""))*"""|"(?:[^"\\\n\r]|\\.)*"|#[^\n\r]*', re.DOTALL)
_NOT_BRACKETS = re.compile(r"[^{}()\[\]]+")


@dataclass(frozen=True, slots=True)
class GraphqlLimits:
    """How much GraphQL the reader analyses."""

    max_bytes: int = 64 * 1024
    max_tokens: int = 10_000
    max_nesting: int = 64
    max_nodes: int = 10_000
    max_batch: int = 16


DEFAULT_GRAPHQL_LIMITS = GraphqlLimits()


@dataclass(frozen=True, slots=True)
class GraphqlOperation:
    """One operation of a document. `type`: query, mutation or subscription."""

    type: str
    name: str | None
    root_fields: tuple[str, ...]
    depth: int
    aliases: int
    fields: int
    introspection: bool


@dataclass(frozen=True, slots=True)
class GraphqlRequest:
    """One GraphQL request: every operation of its document, the one that would run, and a
    persisted query's hash (then `operations` is empty when no query text came with it)."""

    operations: tuple[GraphqlOperation, ...]
    selected: GraphqlOperation | None
    persisted_hash: str | None = None
    introspection: bool = False


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
    document = _parse_bounded(query, limits)
    operations: list[OperationDefinitionNode] = []
    fragments: dict[str, FragmentDefinitionNode] = {}
    for definition in document.definitions:
        if isinstance(definition, OperationDefinitionNode):
            operations.append(definition)
        elif isinstance(definition, FragmentDefinitionNode):
            if definition.name.value in fragments:
                _fail(Problem.GRAPHQL_SYNTAX, f"fragment {definition.name.value!r} defined twice")
            fragments[definition.name.value] = definition
        else:
            _fail(Problem.GRAPHQL_SYNTAX, "a request document holds only operations and fragments")
    selected_node = _select(operations, operation_name)
    analysed = tuple(_analyse(op, fragments, limits) for op in operations)
    selected = analysed[operations.index(selected_node)]
    return GraphqlRequest(analysed, selected, None, _names_anywhere(document) & INTROSPECTION_FIELDS != set())


def _parse_bounded(query: str, limits: GraphqlLimits) -> DocumentNode:
    """graphql-core's parse, after size and nesting checks, with a token limit."""
    size = len(query.encode("utf-8", "replace"))
    if size > limits.max_bytes:
        _fail(Problem.TOO_LARGE, f"{size} bytes of query, the limit is {limits.max_bytes}")
    nesting = _nesting(query)
    if nesting > limits.max_nesting:
        _fail(Problem.TOO_DEEP, f"nested {nesting} levels, the limit is {limits.max_nesting}")
    try:
        return parse(query, no_location=True, max_tokens=limits.max_tokens)
    except GraphQLError as e:
        code = Problem.TOO_MANY_TOKENS if "more than" in e.message else Problem.GRAPHQL_SYNTAX
        _fail(code, e.message)
    except RecursionError:
        _fail(Problem.TOO_DEEP, "nested too deep to parse")


def _nesting(query: str) -> int:
    """The deepest bracket nesting outside strings and comments (unbalanced counts high)."""
    brackets = _NOT_BRACKETS.sub("", _NOT_CODE.sub("", query))
    return max(accumulate(1 if c in "{([" else -1 for c in brackets), default=0)


def _select(operations: Sequence[OperationDefinitionNode], name: str | None) -> OperationDefinitionNode:
    """The operation that would run: the named one, or the only one."""
    if not operations:
        _fail(Problem.NO_OPERATION, "the document has no operation")
    names = [op.name.value if op.name else None for op in operations]
    if len(operations) > 1 and (None in names or len(set(names)) != len(names)):
        _fail(Problem.AMBIGUOUS_OPERATION, "several operations, one of them anonymous or two with one name")
    if name is None:
        if len(operations) > 1:
            _fail(Problem.AMBIGUOUS_OPERATION, "several operations and no operationName")
        return operations[0]
    if name not in names:
        _fail(Problem.NO_OPERATION, f"no operation named {name[:40]!r}")
    return operations[names.index(name)]


def _analyse(
    operation: OperationDefinitionNode, fragments: Mapping[str, FragmentDefinitionNode], limits: GraphqlLimits
) -> GraphqlOperation:
    """One operation's root fields and costs, fragments expanded within `max_nodes`."""
    root_fields: list[str] = []
    depth = aliases = fields = 0
    introspection = False
    # (selection set, depth of its fields, fragments spread on the way here)
    stack: list[tuple[SelectionSetNode, int, frozenset[str]]] = [(operation.selection_set, 1, frozenset())]
    while stack:
        selection_set, level, path = stack.pop()
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                fields += 1
                if fields > limits.max_nodes:
                    _fail(Problem.TOO_COMPLEX, f"more than {limits.max_nodes} fields with fragments expanded")
                depth = max(depth, level)
                aliases += selection.alias is not None
                introspection = introspection or selection.name.value in INTROSPECTION_FIELDS
                if level == 1:
                    root_fields.append(selection.name.value)
                if selection.selection_set is not None:
                    stack.append((selection.selection_set, level + 1, path))
            elif isinstance(selection, InlineFragmentNode):
                stack.append((selection.selection_set, level, path))
            elif isinstance(selection, FragmentSpreadNode):
                stack.append((_spread(selection, fragments, path), level, path | {selection.name.value}))
    return GraphqlOperation(
        operation.operation.value,
        operation.name.value if operation.name else None,
        tuple(sorted(set(root_fields))),
        depth,
        aliases,
        fields,
        introspection,
    )


def _spread(
    spread: FragmentSpreadNode, fragments: Mapping[str, FragmentDefinitionNode], path: frozenset[str]
) -> SelectionSetNode:
    """The selection set a fragment spread stands for; refuse unknown and cyclic ones."""
    name = spread.name.value
    if name in path:
        _fail(Problem.FRAGMENT_CYCLE, f"fragment {name!r} spreads itself")
    fragment = fragments.get(name)
    if fragment is None:
        _fail(Problem.UNKNOWN_FRAGMENT, f"no fragment named {name!r}")
    return fragment.selection_set


def _names_anywhere(document: DocumentNode) -> set[str]:
    """Every field name written in the document, used or not (no expansion: linear)."""
    names: set[str] = set()
    stack = [
        d.selection_set
        for d in document.definitions
        if isinstance(d, OperationDefinitionNode | FragmentDefinitionNode)
    ]
    while stack:
        for selection in stack.pop().selections:
            if isinstance(selection, FieldNode):
                names.add(selection.name.value)
            selection_set = getattr(selection, "selection_set", None)
            if selection_set is not None:
                stack.append(selection_set)
    return names


def _fail(code: Problem, message: str) -> NoReturn:
    raise GraphqlError(code, message)
