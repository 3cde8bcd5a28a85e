"""The ceiling's `protocols:` entries: what no tenant's protocol section may ever allow on
some hosts, and that a section must decide every request to them (pydantic).

    protocols:
      - id: github-mcp
        hosts: [mcp.github.example]       # and/or cidrs; ports default to every port
        mcp:                              # or jsonrpc: or graphql:, one of them
          methods: {deny: ["sampling/*"]}
          tools: {deny: ["delete_*", "merge_*"]}
          resources: {deny: ["file:///*"]}
          prompts: {deny: ["admin_*"]}
      - hosts: [rpc.example]
        jsonrpc: {methods: {deny: ["admin_*", "debug_*"]}}
      - hosts: [api.example]
        graphql:
          operation_types: {deny: [mutation, subscription]}
          root_fields: {deny: ["delete*", "mutation.update*"]}

Deny globs are those of the tenant sections (`*` any run, `?` one character) and match in
any case, as a tenant's deny lists do. An entry with no deny list (`mcp: {}`) only requires
the section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandgate.policy.ceiling.shape import PortOrRange, RuleShape
from sandgate.policy.model.tenant import NAME_PATTERN, HostPattern, Network
from sandgate.policy.protocols.rules import FieldGlob, MethodGlob, OperationType, ToolGlob, UriGlob

__all__ = [
    "GraphqlBound",
    "JsonRpcBound",
    "McpBound",
    "ProtocolBound",
    "ProtocolEntry",
    "Section",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MethodDeny(_Strict):
    """Method globs no section may allow."""

    deny: list[MethodGlob] = Field(default_factory=list, description="method globs never allowed (any case)")


class ToolDeny(_Strict):
    """Name globs no section may allow."""

    deny: list[ToolGlob] = Field(default_factory=list, description="name globs never allowed (any case)")


class UriDeny(_Strict):
    """URI globs no section may allow."""

    deny: list[UriGlob] = Field(default_factory=list, description="URI globs never allowed (any case)")


class FieldDeny(_Strict):
    """Root field globs no section may allow."""

    deny: list[FieldGlob] = Field(
        default_factory=list,
        description="root field globs (`field` or `mutation.field`) never allowed (any case)",
    )


class TypeDeny(_Strict):
    """Operation types no section may allow."""

    deny: list[OperationType] = Field(default_factory=list, description="operation types never allowed")


class McpBound(_Strict):
    """What no `mcp:` section on these hosts may allow."""

    methods: MethodDeny = Field(default_factory=MethodDeny, description="JSON-RPC methods")
    tools: ToolDeny = Field(default_factory=ToolDeny, description="tools (tools/call)")
    resources: UriDeny = Field(default_factory=UriDeny, description="resource URIs (resources/read, ...)")
    prompts: ToolDeny = Field(default_factory=ToolDeny, description="prompt names (prompts/get)")


class JsonRpcBound(_Strict):
    """What no `jsonrpc:` section on these hosts may allow."""

    methods: MethodDeny = Field(default_factory=MethodDeny, description="methods")


class GraphqlBound(_Strict):
    """What no `graphql:` section on these hosts may allow."""

    operation_types: TypeDeny = Field(default_factory=TypeDeny, description="operation types")
    root_fields: FieldDeny = Field(default_factory=FieldDeny, description="root fields")


type Section = McpBound | JsonRpcBound | GraphqlBound


class ProtocolBound(_Strict):
    """Hosts (and/or networks, ports) whose every request a protocol section must decide, and
    what that section may never allow."""

    id: Annotated[str, Field(pattern=NAME_PATTERN)] | None = Field(
        default=None, description="names the entry in reports (`ceiling/protocols/<id>`); unset: its index"
    )
    hosts: list[HostPattern] = Field(default_factory=list, description="exact hosts, '*.suffix' or '*'")
    cidrs: list[Network] = Field(default_factory=list, description="networks, e.g. 10.1.2.0/24")
    ports: Annotated[list[PortOrRange], Field(min_length=1)] | None = Field(
        default=None, description="ports and 'low-high' ranges; default: every port"
    )
    mcp: McpBound | None = Field(
        default=None, description="an `mcp:` section must decide, within these bounds"
    )
    jsonrpc: JsonRpcBound | None = Field(
        default=None, description="a `jsonrpc:` section must decide, within these bounds"
    )
    graphql: GraphqlBound | None = Field(
        default=None, description="a `graphql:` section must decide, within these bounds"
    )
    comment: str | None = Field(default=None, description="a note for people; not read")

    @model_validator(mode="after")
    def _shape(self) -> ProtocolBound:
        if not self.hosts and not self.cidrs:
            raise ValueError("a protocols entry needs 'hosts' or 'cidrs'")
        if sum(s is not None for s in (self.mcp, self.jsonrpc, self.graphql)) != 1:
            raise ValueError("a protocols entry names exactly one of 'mcp', 'jsonrpc' and 'graphql'")
        return self

    @property
    def kind(self) -> str:
        return "mcp" if self.mcp is not None else "jsonrpc" if self.jsonrpc is not None else "graphql"

    @property
    def section(self) -> Section:
        section = self.mcp or self.jsonrpc or self.graphql
        assert section is not None  # the validator saw to it
        return section


@dataclass(frozen=True, slots=True)
class ProtocolEntry:
    """A loaded `protocols` entry: where it applies (a shape with `file:line`), its kind and bounds."""

    shape: RuleShape
    kind: str
    bound: Section
