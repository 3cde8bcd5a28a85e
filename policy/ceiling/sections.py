"""Tenants' protocol sections against the ceiling's `protocols:` entries (`policy prove`). No I/O.

A section applies to every request to its rule's hosts and ports, whichever rule allows the
request (sandgate.policy.evaluation), so for each entry:

- a tenant rule without a section whose requests reach the entry's hosts and ports (less
  its deny rules) must have them all covered by the hosts and ports of sectioned rules, else
  some request there is decided by no section: found, with that request;
- a sectioned rule whose hosts and ports meet the entry's must carry a section of the
  entry's kind, and that section must allow nothing the entry denies: a name its allow (or
  ask) globs match, its deny globs do not, and one of the entry's deny globs matches in any
  case (sandgate.policy.protocols.glob_overlap decides it exactly). A GraphQL section that
  lists persisted queries runs them unread, so it is found under any GraphQL bound.

Conservative where runtime facts are missing: a name that resolves into a sectioned network
is not counted as covered, and a sectioned rule's own deny rules are not taken from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from sandgate.policy.ceiling.bounds import GraphqlBound, JsonRpcBound, McpBound, ProtocolEntry
from sandgate.policy.ceiling.prove import CounterExample, shared
from sandgate.policy.ceiling.shape import RuleShape
from sandgate.policy.protocols.glob_overlap import (
    ANY_TEXT,
    GRAPHQL_NAMES,
    TOOL_NAMES,
    Glob,
    Names,
    derive,
    matches,
    witness,
)
from sandgate.policy.protocols.mcp import PROMPTS_GET, RESOURCE_METHODS, TOOLS_CALL
from sandgate.policy.protocols.rules import GraphqlSection, JsonRpcSection, McpSection, MethodRules

__all__ = ["Finding", "section_findings"]

# (the message, what in the section allows it, what in the entry denies it: None when the
# section is of another kind than the entry requires)
type _Found = tuple[str | None, str, str | None]

_META_FIELDS = ("__typename",)
_INTROSPECTION = ("__schema", "__type")


@dataclass(frozen=True, slots=True)
class Finding:
    """A rule that lets a request (or one of its messages) past a `protocols` entry."""

    rule: RuleShape
    example: CounterExample | None
    # The protocol message the section allows and the entry denies (`tool 'delete_x'`).
    message: str | None
    why: str


def section_findings(
    rules: Sequence[RuleShape], denies: Sequence[RuleShape], entry: ProtocolEntry
) -> list[Finding]:
    """What `rules` (a tenant's allow rules and grants, less `denies`) let past `entry`."""
    sectioned = [replace(r, methods=None, paths=None, raw_tcp=False) for r in rules if r.messages is not None]
    where = f"the ceiling's {entry.shape.rule_id} ({entry.shape.origin})"
    required = f"{where} requires a section of kind '{entry.kind}'"
    found: list[Finding] = []
    for rule in rules:
        if rule.messages is None:
            example = shared(rule, entry.shape, (*denies, *sectioned))
            if example is not None:
                found.append(
                    Finding(rule, example, None, f"no protocol section decides this request; {required}")
                )
            continue
        # Its section applies to every request to its hosts and ports, whatever else it says.
        example = shared(replace(rule, methods=None, paths=None, raw_tcp=False), entry.shape)
        if example is None:
            continue
        post = replace(example, method="POST")  # a message travels in a body
        for message, allows, denies_it in _allowed(rule, entry):
            then = f"{where} denies it: {denies_it}" if denies_it is not None else required
            found.append(Finding(rule, post, message, f"{allows}; {then}"))
    return found


def _allowed(rule: RuleShape, entry: ProtocolEntry) -> list[_Found]:
    """What the rule's section allows that the entry's bound denies."""
    section, bound = rule.messages, entry.bound
    if isinstance(section, McpSection) and isinstance(bound, McpBound):
        return _mcp(section, bound)
    if isinstance(section, JsonRpcSection) and isinstance(bound, JsonRpcBound):
        return _methods(section.methods, bound.methods.deny, "jsonrpc")
    if isinstance(section, GraphqlSection) and isinstance(bound, GraphqlBound):
        return _graphql(section, bound)
    kind = (
        "mcp"
        if isinstance(section, McpSection)
        else "jsonrpc"
        if isinstance(section, JsonRpcSection)
        else "graphql"
    )
    return [(None, f"its section is '{kind}:', not '{entry.kind}:'", None)]


def _globs(entries: Sequence[str] | None, fold: bool, field: str) -> list[Glob]:
    return [Glob(g, fold, f"{field}[{i}] {g!r}") for i, g in enumerate(entries or ())]


def _overlap(
    allow: list[Glob], ceiling: list[Glob], tenant_deny: list[Glob], names: Names, what: str
) -> list[_Found]:
    """A name the allow globs and the ceiling's deny globs share (less the tenant's deny globs), if any."""
    name = witness([allow, ceiling], tenant_deny, names)
    if name is None:
        return []
    by = next(g.label for g in allow if matches(g, name))
    denied = next(g.label for g in ceiling if matches(g, name))
    return [(f"{what} {name!r}", f"{by} allows it", denied)]


def _methods(rules: MethodRules, deny: list[str], kind: str) -> list[_Found]:
    allow = _globs(rules.allow, False, f"{kind}.methods.allow")
    ceiling = _globs(deny, True, f"{kind}.methods.deny")
    return _overlap(allow, ceiling, _globs(rules.deny, True, ""), ANY_TEXT, "method")


def _mcp(section: McpSection, bound: McpBound) -> list[_Found]:
    found = _methods(section.methods, bound.methods.deny, "mcp")
    methods = section.methods

    def called(method: str) -> bool:
        return methods.allowed(method) is not None and methods.denied(method) is None

    t, r, p = section.tools, section.resources, section.prompts
    if called(TOOLS_CALL) and bound.tools.deny:
        allow = _globs(t.allow, False, "mcp.tools.allow") + _globs(t.ask, True, "mcp.tools.ask")
        ceiling = _globs(bound.tools.deny, True, "mcp.tools.deny")
        found += _overlap(allow, ceiling, _globs(t.deny, True, ""), TOOL_NAMES, "tools/call of tool")
    if any(called(m) for m in RESOURCE_METHODS) and bound.resources.deny:
        allow = _globs(r.allow, False, "mcp.resources.allow")
        ceiling = _globs(bound.resources.deny, True, "mcp.resources.deny")
        found += _overlap(allow, ceiling, _globs(r.deny, True, ""), ANY_TEXT, "resource")
    if called(PROMPTS_GET) and bound.prompts.deny:
        allow = _globs(p.allow, False, "mcp.prompts.allow")
        ceiling = _globs(bound.prompts.deny, True, "mcp.prompts.deny")
        found += _overlap(allow, ceiling, _globs(p.deny, True, ""), TOOL_NAMES, "prompts/get of prompt")
    return found


def _graphql(section: GraphqlSection, bound: GraphqlBound) -> list[_Found]:
    found: list[_Found] = []
    denied_types = set(bound.operation_types.deny)
    for kind in section.operation_types:
        if kind in denied_types:
            found.append(
                (f"a {kind} operation", f"graphql.operation_types allows {kind}", "operation_types.deny")
            )
    if section.persisted_queries and (denied_types or bound.root_fields.deny):
        allows = "graphql.persisted_queries runs a listed query as it is, unread"
        found.append(("a persisted query", allows, "graphql bounds"))
    if bound.root_fields.deny:
        for kind in section.operation_types:
            if kind not in denied_types:
                found += _root_fields(section, bound, kind)
    return found


def _root_fields(section: GraphqlSection, bound: GraphqlBound, kind: str) -> list[_Found]:
    """A root field of a `kind` operation the section allows and the bound denies: a field is
    matched as `field` and as `kind.field` (sandgate.policy.protocols.decide)."""
    rules = section.root_fields
    allowed = rules.allow if rules.allow is not None else ["*"]
    meta = [*_META_FIELDS, *(_INTROSPECTION if section.introspection else ())]
    allow = _spellings(
        _globs(allowed, False, "graphql.root_fields.allow") + _globs(meta, False, "a meta field"), kind
    )
    ceiling = _spellings(_globs(bound.root_fields.deny, True, "graphql.root_fields.deny"), kind)
    minus = _spellings(_globs(rules.deny, True, ""), kind)
    return _overlap(allow, ceiling, minus, GRAPHQL_NAMES, f"{kind} root field")


def _spellings(globs: list[Glob], kind: str) -> list[Glob]:
    """Globs matching `field` whenever the given ones match `field` or `kind.field`."""
    return [d for g in globs for d in (g, *derive(g, f"{kind}."))]
