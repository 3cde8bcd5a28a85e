"""The ceiling file: the regions every tenant's rules must stay inside, and what only a person
may grant (pydantic; errors as `file:line:column: field: problem`, like policy files).

    description: what this ceiling is for
    regions:                       # a request is inside when SOME region allows all of it
      - id: packages
        hosts: [pypi.org, "*.pythonhosted.org"]   # the tenant host syntax: name, *.suffix, *
        cidrs: [10.20.0.0/16]      # IP destinations
        ports: [443, "8000-8999"]  # default: every port
        methods: [GET, HEAD]       # default: every method
        paths: ["/simple/**"]      # default: every path (the tenant glob syntax)
    always_human:                  # what an automatic approval never grants
      - hosts: [api.github.com]
    protocols:                     # hosts a protocol section must decide, and what it may never
      - hosts: [mcp.github.example]  # allow (sandgate.policy.ceiling.bounds)
        mcp: {tools: {deny: ["delete_*"]}}
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandgate.policy.ceiling.bounds import ProtocolBound, ProtocolEntry
from sandgate.policy.ceiling.sets import Intervals
from sandgate.policy.ceiling.shape import PortOrRange, RuleShape, port_span, ports_of
from sandgate.policy.model.tenant import NAME_PATTERN, HostPattern, Method, Network, PathGlob
from sandgate.policy.model.yamlsource import YamlDocument, load_yaml, validate

__all__ = ["Ceiling", "CeilingFile", "Region", "load_ceiling", "port_span"]


class Region(BaseModel):
    """Requests the ceiling allows: hosts and/or networks, with optional ports, methods, paths."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(pattern=NAME_PATTERN)] | None = Field(
        default=None,
        description="names the region in reports (`ceiling/regions/<id>`); unset: its index in the list",
    )
    hosts: list[HostPattern] = Field(default_factory=list, description="exact hosts, '*.suffix' or '*'")
    cidrs: list[Network] = Field(default_factory=list, description="networks, e.g. 10.1.2.0/24")
    ports: Annotated[list[PortOrRange], Field(min_length=1)] | None = Field(
        default=None, description="ports and 'low-high' ranges; default: every port"
    )
    methods: Annotated[list[Method], Field(min_length=1)] | None = Field(
        default=None, description="HTTP methods; default: every method (and raw TCP, without paths)"
    )
    paths: Annotated[list[PathGlob], Field(min_length=1)] | None = Field(
        default=None, description="path globs: '*' within a segment, '**' across; default: every path"
    )
    comment: str | None = Field(default=None, description="a note for people; not read")

    @model_validator(mode="after")
    def _names_something(self) -> Region:
        if not self.hosts and not self.cidrs:
            raise ValueError("a region needs 'hosts' or 'cidrs'")
        return self


class CeilingFile(BaseModel):
    """A ceiling: what any tenant may be allowed, and what only a person may approve."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str | None = Field(default=None, description="what the ceiling is for; for people only")
    regions: list[Region] = Field(default_factory=list)
    always_human: list[Region] = Field(
        default_factory=list,
        description="what an automatic approval never grants (credential-bound hosts, for example)",
    )
    protocols: list[ProtocolBound] = Field(
        default_factory=list,
        description=(
            "hosts whose every request an `mcp:`, `jsonrpc:` or `graphql:` section must decide, and "
            "what that section may never allow"
        ),
    )


@dataclass(frozen=True, slots=True)
class Ceiling:
    """A loaded ceiling: its regions and always-human entries as shapes with `file:line`."""

    file: str
    regions: tuple[RuleShape, ...]
    always_human: tuple[RuleShape, ...] = ()
    protocols: tuple[ProtocolEntry, ...] = ()


def load_ceiling(path: Path) -> Ceiling:
    """Read and validate a ceiling file; PolicyLoadError / PolicySetError name file:line."""
    doc = load_yaml(path)
    model = validate(CeilingFile, doc)
    return Ceiling(
        str(path),
        tuple(_shape(doc, "regions", i, r) for i, r in enumerate(model.regions)),
        tuple(_shape(doc, "always_human", i, r) for i, r in enumerate(model.always_human)),
        tuple(_protocol(doc, i, p) for i, p in enumerate(model.protocols)),
    )


def _shape(doc: YamlDocument, key: str, i: int, region: Region) -> RuleShape:
    where = doc.locate((key, i))
    ports: Intervals = ports_of(_port_spans(region.ports))
    return RuleShape(
        hosts=tuple(region.hosts),
        cidrs=tuple(region.cidrs),
        ports=ports,
        methods=frozenset(region.methods) if region.methods is not None else None,
        paths=tuple(region.paths) if region.paths is not None else None,
        rule_id=f"ceiling/{key}/{region.id or i}",
        origin=f"{where.file}:{where.line}" if where.line is not None else where.file,
    )


def _protocol(doc: YamlDocument, i: int, entry: ProtocolBound) -> ProtocolEntry:
    region = Region(id=entry.id, hosts=entry.hosts, cidrs=entry.cidrs, ports=entry.ports)
    return ProtocolEntry(_shape(doc, "protocols", i, region), entry.kind, entry.section)


def _port_spans(ports: list[int | str] | None) -> list[tuple[int, int]] | None:
    return None if ports is None else [port_span(p) for p in ports]
