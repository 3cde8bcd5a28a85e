"""Rule sections for agent protocols: `mcp:`, `jsonrpc:` and `graphql:` (pydantic, JSON Schema).

Every list is validated entry by entry at load (an error names `mcp.tools.deny.2`), and
every section fails closed: an empty allow list allows nothing. Globs: `*` any run of
characters, `?` one character. Matching (sandgate.policy.protocols.decide): allow lists
match in the case written, deny and ask lists in any case; a glob that runs out of time
(sandgate.policy.protocols.patterns.MATCH_TIMEOUT) matches a deny or ask list (and an
`arguments` key), never an allow list.

A sketch of an MCP section:

    mcp:
      tools:
        allow: ["search_*", "get_*", "create_issue"]
        ask: ["create_*"]
        deny: ["delete_*"]
        arguments:
          create_issue:
            - {path: repo, one_of: ["octo/app", "octo/docs"]}
            - {path: labels[*], max_length: 50}
      resources: {allow: ["repo://octo/*"]}
      prompts: {allow: ["summarise"]}
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from sandgate.policy.protocols.arguments import ArgumentPredicate, parse_path
from sandgate.policy.protocols.patterns import GlobList

__all__ = [
    "DEFAULT_MCP_METHODS",
    "GraphqlFieldRules",
    "GraphqlNameRules",
    "GraphqlSection",
    "JsonRpcSection",
    "McpMethods",
    "McpNames",
    "McpResources",
    "McpSection",
    "McpTools",
    "MethodRules",
]

# MCP's plumbing and its decided methods (tools/call, resources/read, prompts/get are then
# decided by their own lists). Anything else (tasks, sampling, new methods) is refused
# unless a tenant lists it.
DEFAULT_MCP_METHODS = (
    "initialize",
    "ping",
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
)

_TOOL_GLOB = re.compile(r"[A-Za-z0-9_.:/*?-]{1,128}", re.ASCII)
_METHOD_GLOB = re.compile(r"[\x21-\x7e]{1,128}", re.ASCII)
_URI_GLOB = re.compile(r"[^\s\x00-\x1f\x7f]{1,2048}")
_GRAPHQL_NAME_GLOB = re.compile(r"[_A-Za-z*?][_0-9A-Za-z*?]{0,127}", re.ASCII)
_FIELD_GLOB = re.compile(r"(?:(?:query|mutation|subscription)\.)?[_A-Za-z*?][_0-9A-Za-z*?]{0,127}", re.ASCII)


def _checker(pattern: re.Pattern[str], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"{value[:80]!r} is not a {what}")
        return value

    return AfterValidator(check)


ToolGlob = Annotated[str, _checker(_TOOL_GLOB, "tool name glob (A-Z a-z 0-9 _ . : / - and * ?)")]
MethodGlob = Annotated[str, _checker(_METHOD_GLOB, "method glob (printable ASCII, no spaces)")]
UriGlob = Annotated[str, _checker(_URI_GLOB, "URI glob (no spaces or control characters)")]
GraphqlNameGlob = Annotated[str, _checker(_GRAPHQL_NAME_GLOB, "GraphQL name glob")]
FieldGlob = Annotated[str, _checker(_FIELD_GLOB, "GraphQL field glob (`field` or `mutation.field`)")]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _argument_path(value: str) -> str:
    parse_path(value)  # ValueError names what is wrong
    return value


ArgumentPath = Annotated[str, AfterValidator(_argument_path)]


type OperationType = Literal["query", "mutation", "subscription"]


def _queries_only() -> list[OperationType]:
    return ["query"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Lists(_Strict):
    """Compiled allow/deny lists: allow in the case written, deny in any case."""

    _allow: GlobList = PrivateAttr(default_factory=lambda: GlobList(()))
    _deny: GlobList = PrivateAttr(default_factory=lambda: GlobList(()))

    def _compile(self, allow: list[str] | None, deny: list[str]) -> None:
        self._allow = GlobList(allow or ())
        self._deny = GlobList(deny, fold_case=True, timeout_matches=True)

    def allowed(self, name: str) -> int | None:
        """The allow entry that matches, or None."""
        return self._allow.match(name)

    def denied(self, name: str) -> int | None:
        """The deny entry that matches in any case, or None."""
        return self._deny.match(name)


class MethodRules(_Lists):
    """JSON-RPC methods by glob."""

    allow: list[MethodGlob] = Field(default_factory=list, description="method globs allowed")
    deny: list[MethodGlob] = Field(default_factory=list, description="method globs denied (any case); win")

    @model_validator(mode="after")
    def _build(self) -> MethodRules:
        self._compile(self.allow, self.deny)
        return self


class McpMethods(MethodRules):
    """MCP methods by glob; `allow` defaults to MCP's plumbing and decided methods."""

    allow: list[MethodGlob] = Field(
        default_factory=lambda: list(DEFAULT_MCP_METHODS),
        description="method globs allowed (default: initialize, ping, the list methods, tools/call ...)",
    )


class McpTools(_Lists):
    """Which tools an agent may call, must ask for, may not call; and their arguments."""

    allow: list[ToolGlob] = Field(
        default_factory=list, description="tool name globs allowed (case as written)"
    )
    deny: list[ToolGlob] = Field(default_factory=list, description="tool name globs denied (any case); win")
    ask: list[ToolGlob] = Field(
        default_factory=list, description="tool name globs held for an approval (any case), allowed or not"
    )
    arguments: dict[ToolGlob, list[ArgumentPredicate]] = Field(
        default_factory=dict,
        description=(
            "per tool glob (any case), predicates its arguments must all pass; every matching entry applies"
        ),
    )

    record: dict[ToolGlob, list[ArgumentPath]] = Field(
        default_factory=dict,
        description=(
            "per tool glob (any case), argument paths whose values the audit record carries "
            "(`mcp.messages[].arguments`; placeholders masked, 256 characters each at most); "
            "by default a record carries only the arguments' digest"
        ),
    )

    _ask: GlobList = PrivateAttr(default_factory=lambda: GlobList(()))
    _argument_keys: GlobList = PrivateAttr(default_factory=lambda: GlobList(()))
    _record_keys: GlobList = PrivateAttr(default_factory=lambda: GlobList(()))

    @model_validator(mode="after")
    def _build(self) -> McpTools:
        self._compile(self.allow, self.deny)
        self._ask = GlobList(self.ask, fold_case=True, timeout_matches=True)
        self._argument_keys = GlobList(self.arguments, fold_case=True, timeout_matches=True)
        self._record_keys = GlobList(self.record, fold_case=True)
        return self

    def recorded_paths(self, name: str) -> list[str]:
        """The argument paths a record of a call of this tool carries, in order, once each."""
        if not self.record:
            return []
        keys = self._record_keys
        paths = (path for i in keys.match_all(name) for path in self.record[keys.entries[i]])
        return list(dict.fromkeys(paths))

    def asked(self, name: str) -> int | None:
        """The ask entry that matches in any case, or None."""
        return self._ask.match(name)

    def predicates_for(self, name: str) -> list[tuple[str, list[ArgumentPredicate]]]:
        """Every `arguments` entry whose glob matches the tool (any case), in order."""
        keys = self._argument_keys
        return [(keys.entries[i], self.arguments[keys.entries[i]]) for i in keys.match_all(name)]


class McpResources(_Lists):
    """Which resource URIs an agent may read."""

    allow: list[UriGlob] = Field(default_factory=list, description="URI globs allowed (case as written)")
    deny: list[UriGlob] = Field(default_factory=list, description="URI globs denied (any case); win")

    @model_validator(mode="after")
    def _build(self) -> McpResources:
        self._compile(self.allow, self.deny)
        return self


class McpNames(_Lists):
    """Which prompts an agent may get, by name."""

    allow: list[ToolGlob] = Field(default_factory=list, description="name globs allowed (case as written)")
    deny: list[ToolGlob] = Field(default_factory=list, description="name globs denied (any case); win")

    @model_validator(mode="after")
    def _build(self) -> McpNames:
        self._compile(self.allow, self.deny)
        return self


class McpSection(_Strict):
    """An `mcp:` section: what an MCP client may ask of the servers a rule covers."""

    methods: McpMethods = Field(default_factory=McpMethods, description="JSON-RPC methods (MCP's by default)")
    tools: McpTools = Field(default_factory=McpTools, description="tools/call by tool name and arguments")
    resources: McpResources = Field(default_factory=McpResources, description="resources/read by URI")
    prompts: McpNames = Field(default_factory=McpNames, description="prompts/get by name")


class JsonRpcSection(_Strict):
    """A `jsonrpc:` section: which methods a JSON-RPC client may call."""

    methods: MethodRules = Field(default_factory=MethodRules, description="method globs allowed and denied")


class GraphqlNameRules(_Lists):
    """Operation names; `allow` unset means any name (anonymous too)."""

    allow: list[GraphqlNameGlob] | None = Field(default=None, description="name globs allowed; unset: any")
    deny: list[GraphqlNameGlob] = Field(default_factory=list, description="name globs denied (any case); win")

    @model_validator(mode="after")
    def _build(self) -> GraphqlNameRules:
        self._compile(self.allow, self.deny)
        return self


class GraphqlFieldRules(_Lists):
    """Root fields, as `field` (any operation type) or `mutation.field`; `allow` unset means any."""

    allow: list[FieldGlob] | None = Field(default=None, description="root field globs allowed; unset: any")
    deny: list[FieldGlob] = Field(default_factory=list, description="root field globs denied (any case); win")

    @model_validator(mode="after")
    def _build(self) -> GraphqlFieldRules:
        self._compile(self.allow, self.deny)
        return self


class GraphqlSection(_Strict):
    """A `graphql:` section: which operations a client may send, and how costly they may be."""

    operation_types: list[OperationType] = Field(
        default_factory=_queries_only, description="operation types allowed (default: query only)"
    )
    operation_names: GraphqlNameRules = Field(default_factory=GraphqlNameRules, description="operation names")
    root_fields: GraphqlFieldRules = Field(default_factory=GraphqlFieldRules, description="root fields")
    persisted_queries: list[Sha256] = Field(
        default_factory=list,
        description=(
            "sha256 ids of persisted queries allowed as they are; any other id without its query is refused"
        ),
    )
    introspection: bool = Field(
        default=False, description="allow `__schema` and `__type` anywhere in a document"
    )
    max_depth: Annotated[int, Field(ge=1, le=1000)] = Field(default=10, description="deepest field nesting")
    max_aliases: Annotated[int, Field(ge=0, le=100_000)] = Field(
        default=20, description="aliases per operation"
    )
    max_fields: Annotated[int, Field(ge=1, le=100_000)] = Field(
        default=500, description="fields per operation, fragments expanded"
    )

    def model_post_init(self, context: object, /) -> None:
        # graphql-core (~0.14 s) loads with a policy that has a section, not at its first body.
        import sandgate.policy.protocols.graphql_document  # noqa: F401
