"""A GraphQL document parsed with graphql-core and analysed: the operations, their root fields
and costs, as sandgate.policy.protocols.graphql_ops describes them. Apart from it so that
graphql-core loads only when a GraphQL body is read (graphql_ops imports this lazily).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
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
from sandgate.policy.protocols.graphql_model import (
    INTROSPECTION_FIELDS,
    GraphqlLimits,
    GraphqlOperation,
    GraphqlRequest,
)

__all__ = ["analyse_document"]

# What is not code in a document (block strings, strings, comments), and what is not a bracket.
_NOT_CODE = re.compile(r'"""(?:[^"\\]|\\.|"(?!""))*"""|"(?:[^"\\\n\r]|\\.)*"|#[^\n\r]*', re.DOTALL)
_NOT_BRACKETS = re.compile(r"[^{}()\[\]]+")


def analyse_document(query: str, operation_name: str | None, limits: GraphqlLimits) -> GraphqlRequest:
    """Analyse one GraphQL document (every operation, the one that would run), or GraphqlError."""
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
