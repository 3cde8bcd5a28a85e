"""What a GraphQL request is found to ask for, and the bounds of reading it: the values
`graphql_ops` (the request object) and `graphql_document` (the parsed document) share."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_GRAPHQL_LIMITS",
    "INTROSPECTION_FIELDS",
    "GraphqlLimits",
    "GraphqlOperation",
    "GraphqlRequest",
]

INTROSPECTION_FIELDS = frozenset({"__schema", "__type"})


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
