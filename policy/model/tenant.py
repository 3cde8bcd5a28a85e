"""Policy file models: tenant files, presets and the default-deny base (pydantic, JSON Schema).

Entries are validated at load: a wildcard only as a `*.` prefix or as the whole entry `*`
(an allow rule for any name the guard permits; refused in deny rules), non-normalised
hosts and networks refused with "use X instead".
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from sandgate.policy.addresses import parse_network
from sandgate.policy.errors import HostError
from sandgate.policy.hosts import not_normal, parse_host_pattern, parse_ip_literal
from sandgate.policy.matcher import ANY_HOST
from sandgate.policy.model.credentials import Credential
from sandgate.policy.model.source_addresses import source_addresses
from sandgate.policy.paths import glob_problem
from sandgate.policy.protocols.rules import GraphqlSection, JsonRpcSection, McpSection

__all__ = [
    "BaseFile",
    "Limits",
    "PresetFile",
    "Rule",
    "SandboxEntry",
    "TenantFile",
    "tenant_schema",
]

NAME_PATTERN = r"^[a-z0-9](?:[a-z0-9._-]{0,62})$"
# A Linux interface name (IFNAMSIZ - 1 characters).
IFNAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,15}$"
_METHOD = re.compile(r"^[A-Z][A-Z0-9_-]{0,31}$")
_PATH_GLOB = re.compile(r"^/[\x21-\x7e]*$")
_REGO_PATH = re.compile(r"^[^\x00-\x1f]+\.rego$")

Port = Annotated[int, Field(ge=1, le=65535)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_host_pattern(value: str) -> str:
    """Validate `host`, `*.suffix` or `*`; refuse what is not already in normal form."""
    if value == ANY_HOST:
        return value
    wildcard, bare, normal = parse_host_pattern(value, "match every host; name the hosts to allow")
    literal = parse_ip_literal(bare)
    if literal is not None:
        raise ValueError(f"{value!r} is an address: use cidrs: [{literal}/{literal.max_prefixlen}] instead")
    if (error := not_normal(value, wildcard, bare, normal)) is not None:
        raise error
    return value


def check_network(text: str) -> str:
    """Validate a network in normal form (no host bits)."""
    try:
        normal = str(parse_network(text))
    except HostError as e:
        raise ValueError(str(e)) from None
    if normal != text:
        raise ValueError(f"{text!r} is not in normal form: use {normal!r} instead")
    return text


def check_method(value: str) -> str:
    if not _METHOD.match(value):
        raise ValueError(f"{value!r} is not an upper-case HTTP method")
    return value


def check_path_glob(value: str) -> str:
    if not _PATH_GLOB.match(value):
        raise ValueError(f"{value!r}: a path glob starts with '/' and has no spaces")
    problem = glob_problem(value)
    if problem is not None:
        raise ValueError(f"{value!r}: {problem}")
    return value


def check_rego_path(value: str) -> str:
    if not _REGO_PATH.match(value):
        raise ValueError(f"{value!r}: a Rego module is a file path ending in '.rego'")
    if value.endswith("_test.rego"):
        raise ValueError(f"{value!r} is a test module: `sandgate policy test` finds it next to the modules")
    return value


# Validated one entry at a time, so an error names the entry (`allow.0.hosts.2`), not the list.
HostPattern = Annotated[str, AfterValidator(check_host_pattern)]
Network = Annotated[str, AfterValidator(check_network)]
Method = Annotated[str, AfterValidator(check_method)]
PathGlob = Annotated[str, AfterValidator(check_path_glob)]
RegoPath = Annotated[str, AfterValidator(check_rego_path)]


class Rule(_Strict):
    """One allow or deny entry: hosts and/or CIDRs, with optional ports, methods and paths."""

    id: Annotated[str, Field(pattern=NAME_PATTERN)] | None = Field(
        default=None,
        description=(
            "names the rule in decisions and audit records (rule_id `<owner>/<list>/<id>`, e.g. "
            "`demo/allow/api-read`, `base/deny/<id>`); unset: its index in the list"
        ),
    )
    hosts: list[HostPattern] = Field(
        default_factory=list,
        description=(
            "exact hosts, '*.suffix', or '*' (allow rules only: any name the gateway resolves to an "
            "address the guard permits; never an IP literal)"
        ),
    )
    cidrs: list[Network] = Field(default_factory=list, description="networks, e.g. 10.1.2.0/24")
    ports: Annotated[list[Port], Field(min_length=1)] | None = Field(
        default=None, description="allowed ports; allow rules default to [443], deny rules to any"
    )
    methods: Annotated[list[Method], Field(min_length=1)] | None = Field(
        default=None, description="HTTP methods; needs inspection"
    )
    paths: Annotated[list[PathGlob], Field(min_length=1)] | None = Field(
        default=None, description="path globs: '*' within a segment, '**' across segments"
    )
    inspect: bool | None = Field(
        default=None,
        description="intercept TLS to decide per request; defaults to true when methods or paths are set",
    )
    protocol: Literal["http", "tcp"] = Field(
        default="http",
        description=(
            "http: HTTP and TLS, decided by name at every layer; "
            "tcp: raw TCP bytes to these hosts/cidrs and ports (a database), passed through and audited"
        ),
    )
    websocket: bool = Field(
        default=False,
        description=(
            "allow rules: a WebSocket upgrade may pass where the gateway sees HTTP (plain HTTP, "
            "intercepted TLS); its messages are still checked for placeholders and scrubbed. "
            "Every other Upgrade is refused"
        ),
    )
    mcp: McpSection | None = Field(
        default=None,
        description=(
            "allow rules: MCP over HTTP to these hosts is read and decided per message (methods, "
            "tools and their arguments, resources, prompts); implies inspection"
        ),
    )
    jsonrpc: JsonRpcSection | None = Field(
        default=None,
        description=(
            "allow rules: JSON-RPC over HTTP to these hosts is decided per method; implies inspection"
        ),
    )
    graphql: GraphqlSection | None = Field(
        default=None,
        description=(
            "allow rules: GraphQL over HTTP to these hosts is decided per operation (types, names, "
            "root fields, persisted queries, introspection, depth and size); implies inspection"
        ),
    )
    comment: str | None = Field(default=None, description="a note for people; the gateway does not read it")

    @model_validator(mode="after")
    def _shape(self) -> Rule:
        if not self.hosts and not self.cidrs:
            raise ValueError("a rule needs 'hosts' or 'cidrs'")
        if self.inspect is False and (self.methods or self.paths):
            raise ValueError("'methods' and 'paths' can only be checked with 'inspect: true'")
        if self.protocol == "tcp" and (self.methods or self.paths or self.inspect or self.websocket):
            raise ValueError(
                "a 'protocol: tcp' rule passes bytes through: no methods, paths, inspect or websocket"
            )
        if sum(section is not None for section in (self.mcp, self.jsonrpc, self.graphql)) > 1:
            raise ValueError("a rule carries at most one of 'mcp', 'jsonrpc' and 'graphql'; write two rules")
        if self.reads_messages and (self.inspect is False or self.protocol == "tcp"):
            raise ValueError(
                "'mcp', 'jsonrpc' and 'graphql' read each request's body: not with 'inspect: false' or tcp"
            )
        return self

    @property
    def reads_messages(self) -> bool:
        """Whether the rule decides the messages of each request (`mcp:`, `jsonrpc:`, `graphql:`)."""
        return self.messages is not None

    @property
    def messages(self) -> McpSection | JsonRpcSection | GraphqlSection | None:
        """The section that decides each request's messages, if any."""
        return self.mcp or self.jsonrpc or self.graphql

    @property
    def needs_inspection(self) -> bool:
        """Whether matching this rule requires intercepting TLS."""
        if self.inspect is not None:
            return self.inspect
        return bool(self.methods or self.paths) or self.reads_messages


class SandboxEntry(_Strict):
    """A sandbox of this tenant and how it proves who it is."""

    id: Annotated[
        str,
        Field(
            pattern=NAME_PATTERN,
            description=(
                "the sandbox's id, unique across every tenant file and the sandbox registry; the user "
                "name of its Proxy-Authorization (`id:token`) on the explicit proxy"
            ),
        ),
    ]
    token: str | None = Field(
        default=None,
        description=(
            "proxy token reference: 'env:VAR', 'file:PATH' (not group/world readable) or 'sha256:HEX'"
        ),
    )
    addresses: list[str] = Field(
        default_factory=list, description="source addresses (transparent mode identity)"
    )
    interface: Annotated[str, Field(pattern=IFNAME_PATTERN)] | None = Field(
        default=None,
        description=(
            "the host-side interface (TAP or veth) the sandbox's traffic arrives on: the gateway "
            "installs its host rules (anti-spoofing, redirects) at start and at reload"
        ),
    )

    @model_validator(mode="after")
    def _interface_needs_addresses(self) -> SandboxEntry:
        if self.interface is None:
            return self
        if not self.addresses:
            raise ValueError("a sandbox on an interface needs its addresses (for the anti-spoofing rule)")
        # What the host rules install must be addresses a guest can send from (no loopback, ...).
        source_addresses(self.addresses)
        return self


class Limits(_Strict):
    """Per-sandbox limits, and optional caps on all of the tenant's sandboxes together.

    Enforced by every gateway (fleet-wide through redis); unset means no limit. Egress bytes
    are what a sandbox sends upstream (request line, headers and body of HTTP requests).
    """

    request_body_bytes: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="largest request body one request may send (413 body_too_large)"
    )
    requests_per_minute: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="requests (and new tunnels) per sandbox per sliding minute"
    )
    egress_bytes_per_hour: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="bytes sent upstream per sandbox per sliding hour"
    )
    tenant_requests_per_minute: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="requests per sliding minute, all of the tenant's sandboxes together"
    )
    tenant_egress_bytes_per_hour: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="bytes sent upstream per sliding hour, the tenant's sandboxes together",
    )

    @model_validator(mode="after")
    def _tenant_caps_cover_one_sandbox(self) -> Limits:
        pairs = (
            ("requests_per_minute", self.requests_per_minute, self.tenant_requests_per_minute),
            ("egress_bytes_per_hour", self.egress_bytes_per_hour, self.tenant_egress_bytes_per_hour),
        )
        for name, per_sandbox, per_tenant in pairs:
            if per_sandbox is not None and per_tenant is not None and per_tenant < per_sandbox:
                raise ValueError(
                    f"tenant_{name} ({per_tenant}) is below {name} ({per_sandbox}): "
                    f"one sandbox could never use its own limit; raise tenant_{name} or lower {name}"
                )
        return self


class TenantFile(_Strict):
    """One tenant: who its sandboxes are and where they may go."""

    tenant: Annotated[
        str,
        Field(
            pattern=NAME_PATTERN,
            description=(
                "the tenant's name, in rule ids, audit records and metrics; name the file after it "
                "(`<tenant>.yaml`: another file name loads, with a note)"
            ),
        ),
    ]
    mode: Literal["enforce", "report"] = Field(
        default="enforce",
        description=(
            "report: what the tenant's own deny, allow and Rego rules would refuse is let through and "
            "recorded as would_deny; identity, the address guard, the base deny rules and limits "
            "still hold"
        ),
    )
    include: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(
        default_factory=list, description="presets from rules/presets/ whose allow rules apply"
    )
    sandboxes: list[SandboxEntry] = Field(default_factory=list)
    allow: list[Rule] = Field(default_factory=list)
    deny: list[Rule] = Field(default_factory=list)
    ask: list[Rule] = Field(
        default_factory=list,
        description=(
            "rules (the allow-rule shape) whose requests no allow rule allows are held until an "
            "operator approves or denies them (`sandgate requests`); deny rules and the guard refuse first"
        ),
    )
    unmatched: Literal["deny", "ask"] = Field(
        default="deny",
        description="what happens to a request no allow or ask rule matches: deny it, or hold it and ask",
    )
    limits: Limits | None = None
    credentials: list[Credential] = Field(
        default_factory=list,
        description="credentials the gateway injects for this tenant's sandboxes (placeholders in the guest)",
    )
    rego: list[RegoPath] = Field(
        default_factory=list,
        description=(
            "Rego modules (paths relative to this file) in package sandgate.tenants.<tenant>; "
            "data.sandgate.decision must allow too"
        ),
    )
    data: dict[str, Any] | None = Field(
        default=None, description="the tenant's Rego data: data.tenants.<tenant> (data.sandgate.params)"
    )

    @model_validator(mode="after")
    def _deny_rules_allow_nothing(self) -> TenantFile:
        _no_websocket_in(self.deny)
        return self

    @model_validator(mode="after")
    def _unique_credentials(self) -> TenantFile:
        seen: set[str] = set()
        for cred in self.credentials:
            if cred.name in seen:
                raise ValueError(f"credential {cred.name!r} is defined twice")
            seen.add(cred.name)
        return self


class PresetFile(_Strict):
    """A named set of allow rules that tenants include."""

    preset: Annotated[
        str,
        Field(pattern=NAME_PATTERN, description="the preset's name, as tenants list it in `include`"),
    ]
    description: str | None = Field(default=None, description="what the preset is for; for people only")
    allow: list[Rule] = Field(default_factory=list)


class BaseFile(_Strict):
    """The operator's base: deny rules that hold for every tenant, whatever it allows."""

    description: str | None = Field(default=None, description="what the base is for; for people only")
    deny: list[Rule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _deny_rules_allow_nothing(self) -> BaseFile:
        _no_websocket_in(self.deny)
        return self


def _no_websocket_in(deny: list[Rule]) -> None:
    for i, rule in enumerate(deny):
        if rule.websocket:
            raise ValueError(f"deny.{i}: 'websocket' is an allow-rule field (deny rules refuse upgrades too)")


def tenant_schema() -> dict[str, object]:
    """JSON Schema of tenant files, for editors."""
    return TenantFile.model_json_schema()
