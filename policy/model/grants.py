"""Grants: allow rules an operator's approval added, and the grants file that holds a tenant's.

A grant is built from the access request it approves: one exact host, its one port, the
method(s) and the path(s) asked for (exact paths for a held request; a proposal's paths as it
wrote them, in the allow rules' glob language); for a held CONNECT, host and port only. It
joins the tenant's allow rules only (step 4 of sandgate.policy.decide): deny rules, the
operator's base deny rules and the address guard refuse before it is looked at. Scope: one
sandbox, or the whole tenant (`sandbox` None). An expired grant allows nothing, whether or
not anything has swept it yet: expiry is checked at every match.

The grants file of a tenant (`<tenants dir>/<tenant>.grants.yaml`) is written by the gateway
and reviewed like code:

    # sandgate-grants-file v1: written by the gateway, sealed by its last line ...
    tenant: t1
    grants:
      # approval 3f9c...: approved by alice at 2026-12-01T22:40:00Z (scope tenant)
      # why: "the build needs the package index"
      - id: "3f9c..."
        host: api.test
        port: 443
        methods: [GET]
        paths: ["/v1/items"]
        approved_by: alice
        approved_at: "2026-12-01T22:40:00Z"
        reason: the build needs the package index
        expires: "2026-12-02T22:40:00Z"   # optional
        max_uses: 20                      # optional
    # sandgate-grants-file end sha256:<digest of every line above>

Every grant in a grants file states its methods and its paths: `["*"]` alone means every
method (every path), and a grant that says neither is refused, so a file cut or saved
half-way through a grant never allows more than the whole grant would
(sandgate.policy.model.grants_seal: the first and last lines tell a whole gateway-written
file from a cut one; a hand-written file has neither and loads as any policy file does).

A grant with `max_uses` allows at most that many requests in all: each one it lets through
uses one, counted by the gateway (sandgate.proxy.approvals.uses: in redis for a fleet, else in
its state folder), shared by every worker and gateway. Once
used up it is exhausted and matches nothing more, as if it were gone. The counting is the
gateway's (GrantUses, on the Grants snapshot it decides with): evaluating without one (`policy
explain`, `policy test`) counts nothing. A counted grant is always inspected (its connection is
intercepted), so each request is decided, and counted, one by one. A tool grant's `max_uses`
counts the tool calls it releases, one per call (a call decided inside a streamed body, where
nothing can wait for the count, is not released by a counted grant: it is asked about).

A grant with a `tool` (a tool grant) allows one MCP tool call an `mcp.tools.ask` glob would
hold, on its host, port, method and path: that exact tool, and, when it says so, only
arguments whose digest is `arguments_sha256` (the SHA-256 of their canonical JSON) and that
pass every `arguments` predicate. It allows nothing else: never a request by itself (the
policy's grant step passes it over, and it names no host for DNS), never another tool. A
grant without a tool never releases a tool call that is asked about (sandgate.proxy.addons.
agent_protocols looks at tool grants only).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Protocol, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from sandgate.policy.errors import HostError, PolicyLoadError, SourceLocation
from sandgate.policy.hosts import normalise_host, parse_ip_literal
from sandgate.policy.matcher import CompiledRule, compile_path_globs
from sandgate.policy.model.grants_seal import check_seal, seal
from sandgate.policy.model.tenant import NAME_PATTERN, check_method, check_path_glob
from sandgate.policy.model.yamlsource import YamlDocument, parse_yaml, validate
from sandgate.policy.protocols.arguments import ArgumentPredicate, check_arguments
from sandgate.policy.protocols.json_strict import JsonValue
from sandgate.policy.protocols.mcp import canonical_tool_name

__all__ = [
    "APPROVAL_ID",
    "ARGUMENTS_SHA256",
    "EMPTY_GRANTS",
    "EVERY",
    "Grant",
    "GrantEntry",
    "GrantUses",
    "Grants",
    "GrantsFile",
    "GrantsFileEntry",
    "ToolCallAsked",
    "exact_path_problem",
    "format_utc",
    "grant_from_entry",
    "load_grants_file",
    "parse_grants_text",
    "parse_utc",
    "predicate_json",
    "render_grants_file",
]

# An approval (access request) id: lower-case hex, as sandgate.proxy.audit mints decision ids.
APPROVAL_ID = r"^[0-9a-f]{12,64}$"
# The digest of a tool call's arguments (sandgate.proxy.addons.protocol_bodies.arguments_digest).
ARGUMENTS_SHA256 = r"^[0-9a-f]{64}$"

# In a grants file, `methods: ["*"]` (`paths: ["*"]`): every method (path), written out, since
# a grant that leaves them out is refused. `*` as hosts: ["*"] spells "any host" in allow rules;
# it is no method and no path glob (a glob starts with '/'), so it can mean nothing else.
EVERY = "*"


def format_utc(when: float) -> str:
    """Epoch seconds as `2026-12-01T22:40:00Z` (what grants files and listings show)."""
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_utc(text: str) -> float:
    """`2026-12-01T22:40:00Z` (or any ISO 8601 time with a zone) as epoch seconds."""
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone: write it in UTC with a trailing 'Z'")
    return when.timestamp()


@dataclass(frozen=True, slots=True)
class ToolCallAsked:
    """One MCP tool call an `ask` glob would hold, as a tool grant is matched against it: the
    request that carries it (host, port, method, path) and the call (tool, arguments, digest)."""

    host: str
    port: int
    method: str | None
    path: str | None
    tool: str
    arguments: dict[str, JsonValue]
    arguments_sha256: str


@dataclass(frozen=True, slots=True)
class Grant:
    """One allow rule an approval added, to one sandbox or (`sandbox` None) its whole tenant."""

    id: str  # the approval (access request) id: one approval makes at most one grant
    tenant: str
    sandbox: str | None
    host: str
    port: int
    methods: frozenset[str] | None = None
    paths: tuple[str, ...] | None = None  # globs, as written
    expires: float | None = None  # epoch seconds; None: until revoked
    by: str | None = None
    at: float = 0.0
    reason: str | None = None
    # Where it is kept: `file:line` of a grants file, `redis`, or `state` (the gateway's state folder).
    origin: str = ""
    # A tool grant (see the module docstring): the one MCP tool it allows, and optionally the
    # arguments (their digest, predicates they must pass); None: a request grant.
    tool: str | None = None
    arguments_sha256: str | None = None
    arguments: tuple[ArgumentPredicate, ...] | None = None
    # At most this many requests (tool calls) in all, counted by the gateway; None: no limit.
    max_uses: int | None = None
    rule: CompiledRule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ip = parse_ip_literal(self.host)
        rule = CompiledRule(
            rule_id=self.rule_id,
            ports=frozenset({self.port}),
            methods=self.methods,
            paths=compile_path_globs(self.paths) if self.paths is not None else None,
            # A counted grant's requests are each decided (and counted), never tunnelled blind.
            inspect=self.methods is not None or self.paths is not None or self.max_uses is not None,
            hosts=() if ip is not None else (self.host,),
            cidrs=(f"{ip}/{ip.max_prefixlen}",) if ip is not None else (),
            origin=self.origin,
        )
        object.__setattr__(self, "rule", rule)

    @property
    def rule_id(self) -> str:
        """How decisions and the audit trail name it: `<tenant>/grant/<approval id>`."""
        return f"{self.tenant}/grant/{self.id}"

    @property
    def scope(self) -> str:
        return "tenant" if self.sandbox is None else "sandbox"

    def live(self, now: float) -> bool:
        return self.expires is None or now < self.expires

    def matches(
        self, host: str, port: int, method: str | None, path: str | None, upgrade: str | None, now: float
    ) -> bool:
        """Whether it allows this request (at a CONNECT, method and path are None: not yet known).
        A tool grant allows no request: only the tool call it names (matches_call)."""
        r = self.rule
        return (
            self.tool is None
            and self.live(now)
            and host == self.host
            and r.port_ok(port)
            and r.method_ok(method)
            and r.path_ok(path)
            and r.upgrade_ok(upgrade)
        )

    def matches_call(self, call: ToolCallAsked, now: float) -> bool:
        """Whether this tool grant allows one asked tool call (its request and its tool)."""
        r = self.rule
        return (
            self.tool is not None
            and self.tool == call.tool
            and self.live(now)
            and call.host == self.host
            and r.port_ok(call.port)
            and r.method_ok(call.method)
            and r.path_ok(call.path)
            and (self.arguments_sha256 is None or self.arguments_sha256 == call.arguments_sha256)
            and (self.arguments is None or check_arguments(self.arguments, call.arguments) is None)
        )

    def tool_fields(self) -> dict[str, Any]:
        """A tool grant's tool, arguments' digest and predicates (as written), as stores, views
        and records carry them; nothing for a request grant (its records stay as they were)."""
        if self.tool is None:
            return {}
        arguments = [predicate_json(p) for p in self.arguments] if self.arguments is not None else None
        return {"tool": self.tool, "arguments_sha256": self.arguments_sha256, "arguments": arguments}

    def view(self) -> dict[str, Any]:
        """The grant as the admin API and `sandgate requests grants` show it."""
        return {
            "id": self.id,
            "rule_id": self.rule_id,
            "scope": self.scope,
            "tenant": self.tenant,
            "sandbox": self.sandbox,
            "host": self.host,
            "port": self.port,
            "methods": sorted(self.methods) if self.methods is not None else None,
            "paths": list(self.paths) if self.paths is not None else None,
            "expires": format_utc(self.expires) if self.expires is not None else None,
            "max_uses": self.max_uses,
            "by": self.by,
            "at": format_utc(self.at),
            "reason": self.reason,
            "origin": self.origin,
            **self.tool_fields(),
        }

    def as_json(self) -> dict[str, Any]:
        """The grant as stored (redis, the state folder): every field, times as epoch seconds."""
        return {
            "id": self.id,
            "tenant": self.tenant,
            "sandbox": self.sandbox,
            "host": self.host,
            "port": self.port,
            "methods": sorted(self.methods) if self.methods is not None else None,
            "paths": list(self.paths) if self.paths is not None else None,
            "expires": self.expires,
            "max_uses": self.max_uses,
            "by": self.by,
            "at": self.at,
            "reason": self.reason,
            **self.tool_fields(),
        }

    @staticmethod
    def from_json(data: dict[str, Any], origin: str) -> Grant:
        """A stored grant (ValueError, KeyError or TypeError when malformed).

        `methods` and `paths` must be there (`null`: every method, every path, as as_json
        writes it): a record that leaves them out is malformed, never a grant of everything."""
        methods, paths = data["methods"], data["paths"]
        entry = GrantEntry(
            id=str(data["id"]),
            host=str(data["host"]),
            port=int(data["port"]),
            methods=[str(m) for m in methods] if methods is not None else None,
            paths=[str(p) for p in paths] if paths is not None else None,
            tool=data.get("tool"),
            arguments_sha256=data.get("arguments_sha256"),
            arguments=data.get("arguments"),
            max_uses=data.get("max_uses"),
        )
        sandbox = data.get("sandbox")
        expires = data.get("expires")
        return Grant(
            id=entry.id,
            tenant=str(data["tenant"]),
            sandbox=str(sandbox) if sandbox is not None else None,
            host=entry.host,
            port=entry.port,
            methods=frozenset(entry.methods) if entry.methods is not None else None,
            paths=tuple(entry.paths) if entry.paths is not None else None,
            expires=float(expires) if expires is not None else None,
            by=str(data["by"]) if data.get("by") is not None else None,
            at=float(data.get("at") or 0.0),
            reason=str(data["reason"]) if data.get("reason") is not None else None,
            origin=origin,
            max_uses=entry.max_uses,
            **entry.tool_scope(),
        )


class GrantUses(Protocol):
    """Where the uses of counted grants (`max_uses`) are counted: shared by every worker and
    gateway that decides with the same grants (sandgate.proxy.approvals.uses)."""

    def spent(self, grant_id: str) -> bool:
        """Whether this process already knows the grant is used up (no I/O)."""
        ...

    async def take(self, grant: Grant) -> bool:
        """Use one of the grant's uses, atomically: False when none is left, or when the count
        cannot be reached (fail closed: the request is decided as without the grant)."""
        ...


class Grants:
    """A set of grants, indexed by (tenant, host): a lookup is one dict access."""

    __slots__ = ("_all", "_by_host", "counted", "uses")

    def __init__(self, grants: Iterable[Grant] = (), uses: GrantUses | None = None) -> None:
        self._all: tuple[Grant, ...] = tuple(grants)
        # Where counted grants are counted (the gateway's); None: nothing is counted here.
        self.uses = uses
        # Whether any grant here is counted (decide then takes a use of the one that allows).
        self.counted = any(g.max_uses is not None for g in self._all)
        by_host: dict[tuple[str, str], list[Grant]] = {}
        for g in self._all:
            by_host.setdefault((g.tenant, g.host), []).append(g)
        self._by_host = {k: tuple(v) for k, v in by_host.items()}

    def __iter__(self) -> Iterator[Grant]:
        return iter(self._all)

    def __len__(self) -> int:
        return len(self._all)

    def __bool__(self) -> bool:
        return bool(self._all)

    def match(
        self,
        tenant: str,
        sandbox: str,
        host: str,
        port: int,
        method: str | None,
        path: str | None,
        upgrade: str | None,
        now: float,
        skip: Callable[[Grant], bool] | None = None,
    ) -> Grant | None:
        """The first live grant of `tenant` (for the whole tenant, or for `sandbox`) that allows
        it, passing over those `skip` names (used up, or already tried)."""
        for g in self._by_host.get((tenant, host), ()):
            ours = g.sandbox is None or g.sandbox == sandbox
            if ours and g.matches(host, port, method, path, upgrade, now) and (skip is None or not skip(g)):
                return g
        return None

    def match_call(self, tenant: str, sandbox: str, call: ToolCallAsked, now: float) -> Grant | None:
        """The first live tool grant of `tenant` (for the whole tenant, or for `sandbox`) that
        allows this asked tool call."""
        for g in self._by_host.get((tenant, call.host), ()):
            if (g.sandbox is None or g.sandbox == sandbox) and g.matches_call(call, now):
                return g
        return None

    def names_host(self, tenant: str, sandbox: str, host: str, now: float) -> bool:
        """Whether a live request grant of `tenant` (for `sandbox`, or the whole tenant) names
        `host` (a tool grant names none: the allow rule whose tool call it releases does)."""
        return any(
            (g.sandbox is None or g.sandbox == sandbox) and g.live(now) and g.tool is None
            for g in self._by_host.get((tenant, host), ())
        )

    def of_tenant(self, tenant: str) -> tuple[Grant, ...]:
        return tuple(g for g in self._all if g.tenant == tenant)

    def get(self, grant_id: str) -> Grant | None:
        return next((g for g in self._all if g.id == grant_id), None)


EMPTY_GRANTS = Grants()


def _check_host(value: str) -> str:
    """An exact host: a name in normal form, or an IP address; no wildcard."""
    try:
        normal = normalise_host(value)
    except HostError as e:
        raise ValueError(str(e)) from None
    if "*" in value:
        raise ValueError(f"{value!r}: a grant names one exact host, never a wildcard")
    if normal != value:
        raise ValueError(f"{value!r} is not in normal form: use {normal!r} instead")
    return value


def _check_time(value: str) -> str:
    try:
        parse_utc(value)
    except ValueError as e:
        raise ValueError(f"{value!r} is not a time like 2026-12-01T22:40:00Z ({e})") from None
    return value


_Time = Annotated[str, AfterValidator(_check_time)]


def _check_tool(value: str) -> str:
    """An exact MCP tool name, as calls name it (no glob)."""
    canonical_tool_name(value)  # a ValueError (ProtocolError) when it is not one
    return value


class _GrantShape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(pattern=APPROVAL_ID, description="the approval (access request) id")]
    host: Annotated[str, AfterValidator(_check_host), Field(description="one exact host")]
    port: Annotated[int, Field(ge=1, le=65535, description="the one port it allows")]
    tool: Annotated[str, AfterValidator(_check_tool)] | None = Field(
        default=None,
        description="a tool grant: the one MCP tool (exact name) whose asked calls it allows; "
        "it then allows no request by itself",
    )
    arguments_sha256: Annotated[str, Field(pattern=ARGUMENTS_SHA256)] | None = Field(
        default=None,
        description="with tool: only calls whose arguments have this digest (SHA-256 of their "
        "canonical JSON, as audit records show it)",
    )
    arguments: list[ArgumentPredicate] | None = Field(
        default=None,
        min_length=1,
        description="with tool: predicates the arguments of every call it allows must pass "
        "(as in mcp.tools.arguments)",
    )

    max_uses: Annotated[int, Field(ge=1, le=1_000_000_000)] | None = Field(
        default=None,
        description="at most this many requests in all, counted by the gateway across its workers "
        "(and the fleet's gateways with redis); none: no limit. On a tool grant, tool calls",
    )

    @model_validator(mode="after")
    def _tool_scoped(self) -> Self:
        if self.tool is None and (self.arguments_sha256 is not None or self.arguments is not None):
            raise ValueError("arguments_sha256 and arguments go with tool: name the tool they are for")
        return self

    def tool_scope(self) -> dict[str, Any]:
        """Its tool fields as a Grant holds them."""
        arguments = tuple(self.arguments) if self.arguments is not None else None
        return {"tool": self.tool, "arguments_sha256": self.arguments_sha256, "arguments": arguments}


class GrantEntry(_GrantShape):
    """A grant's destination, methods and paths, checked (None: every method, every path), as
    an approval builds it and the gateway's grants store reads it back."""

    methods: list[Annotated[str, AfterValidator(check_method)]] | None = Field(default=None, min_length=1)
    paths: list[Annotated[str, AfterValidator(check_path_glob)]] | None = Field(default=None, min_length=1)


def _check_method_entry(value: str) -> str:
    return value if value == EVERY else check_method(value)


def _check_path_entry(value: str) -> str:
    return value if value == EVERY else check_path_glob(value)


def _stated(values: list[str] | None, key: str, what: str) -> list[str]:
    """`values` as written: present, and `*` alone or not at all."""
    if values is None:
        # A file cut (or saved) before this line must not read as a grant of everything.
        raise ValueError(f'missing: name the {what}s it allows, or write {key}: ["*"] for every {what}')
    if EVERY in values and len(values) > 1:
        raise ValueError(f'"*" means every {what}: write it alone, or name the {what}s without it')
    return values


class GrantsFileEntry(_GrantShape):
    """One grant as a grants file writes it: methods and paths always stated (`["*"]`: all)."""

    methods: list[Annotated[str, AfterValidator(_check_method_entry)]] | None = Field(
        default=None,
        min_length=1,
        validate_default=True,
        description='HTTP methods, or ["*"] for every method (required)',
    )
    paths: list[Annotated[str, AfterValidator(_check_path_entry)]] | None = Field(
        default=None,
        min_length=1,
        validate_default=True,
        description='path globs, or ["*"] for every path, as sent (required)',
    )
    approved_by: Annotated[str, Field(max_length=200)] | None = Field(
        default=None, description="who approved it; carried into the grant's audit records"
    )
    approved_at: _Time | None = Field(
        default=None, description="when it was approved (UTC, like 2026-12-01T22:40:00Z)"
    )
    reason: Annotated[str, Field(max_length=2000)] | None = Field(
        default=None, description="why, as the approver wrote it; carried into the grant's audit records"
    )
    expires: _Time | None = Field(default=None, description="when it stops allowing (UTC); none: never")

    @field_validator("methods", mode="after")
    @classmethod
    def _methods_stated(cls, value: list[str] | None) -> list[str]:
        return _stated(value, "methods", "method")

    @field_validator("paths", mode="after")
    @classmethod
    def _paths_stated(cls, value: list[str] | None) -> list[str]:
        return _stated(value, "paths", "path")

    def method_set(self) -> frozenset[str] | None:
        """The methods as a Grant holds them (None: every method)."""
        return None if self.methods is None or self.methods == [EVERY] else frozenset(self.methods)

    def path_globs(self) -> tuple[str, ...] | None:
        """The path globs as a Grant holds them (None: every path)."""
        return None if self.paths is None or self.paths == [EVERY] else tuple(self.paths)


class GrantsFile(BaseModel):
    """A tenant's grants file (`<tenants dir>/<tenant>.grants.yaml`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: Annotated[
        str,
        Field(
            pattern=NAME_PATTERN,
            description=(
                "the tenant the grants are for: the one the file is named after (`<tenant>.grants.yaml`)"
            ),
        ),
    ]
    grants: list[GrantsFileEntry] = Field(default_factory=list)


def parse_grants_text(text: str, file: str) -> tuple[YamlDocument, GrantsFile]:
    """A grants file's text, checked whole: its seal (when the gateway wrote it), YAML and
    schema; PolicyLoadError (or PolicySetError) naming file, line and field otherwise."""
    check_seal(text, file)
    doc = parse_yaml(text, file)
    return doc, validate(GrantsFile, doc)


def load_grants_file(path: Path) -> tuple[YamlDocument, GrantsFile]:
    """Read a grants file once and check it whole (parse_grants_text)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyLoadError(SourceLocation(str(path)), "", f"cannot read: {e}") from e
    return parse_grants_text(text, str(path))


def grant_from_entry(tenant: str, entry: GrantsFileEntry, origin: str) -> Grant:
    """A grants file's entry as a tenant-wide grant."""
    return Grant(
        id=entry.id,
        tenant=tenant,
        sandbox=None,
        host=entry.host,
        port=entry.port,
        methods=entry.method_set(),
        paths=entry.path_globs(),
        expires=parse_utc(entry.expires) if entry.expires is not None else None,
        by=entry.approved_by,
        at=parse_utc(entry.approved_at) if entry.approved_at is not None else 0.0,
        reason=entry.reason,
        origin=origin,
        max_uses=entry.max_uses,
        **entry.tool_scope(),
    )


# A path a held request asked for becomes a grant's glob as is: only where no character in it
# reads as a glob (`*`; `?` never reaches a path), so the grant allows exactly that path.
_GLOB_CHARS = re.compile(r"[*?]")


def exact_path_problem(path: str) -> str | None:
    """Why `path` cannot be granted as one exact path, or None."""
    if _GLOB_CHARS.search(path):
        return f"{path!r} has '*', which a grant would read as a glob: approve it once, or add an allow rule"
    return None


# Line breaks (YAML's \x85, \u2028, \u2029 too) would end the comment; what YAML refuses even in a
# comment (C0 and C1 controls, surrogates, non-characters) would leave a file that does not load.
_UNSAFE_IN_COMMENT = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]+")


def _comment_text(text: str | None, limit: int = 300) -> str:
    """Text on one comment line: control characters and line breaks folded to a space."""
    if not text:
        return "-"
    flat = _UNSAFE_IN_COMMENT.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _scalar(value: str) -> str:
    """A double-quoted YAML scalar, ASCII only, that reads back as exactly `value`.

    Not json.dumps: JSON writes a character beyond U+FFFF as two surrogate escapes, which YAML
    refuses, so the file would not load. A lone surrogate (no character) becomes U+FFFD."""
    return '"' + "".join(_escape(ch) for ch in value) + '"'


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    if 0x20 <= code < 0x7F:
        return ch
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if 0xD800 <= code <= 0xDFFF:
        return "\\ufffd"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def render_grants_file(tenant: str, grants: Iterable[Grant]) -> str:
    """A tenant's grants file, sealed: each grant with a comment saying who approved it, when,
    why, and its approval id (sandgate.policy.model.grants documents the format)."""
    lines = [
        f"# Grants for tenant {tenant}: allow rules approvals added (`sandgate requests approve",
        "# --scope tenant`). Review it like code. A grant allows one host and port, and the methods",
        '# and paths it names (["*"]: every one); deny rules and the address guard still refuse',
        "# first. Remove an entry (or `sandgate requests revoke ID`) to withdraw it.",
        f"tenant: {tenant}",
    ]
    entries = sorted(grants, key=lambda g: (g.at, g.id))
    lines.append("grants:" if entries else "grants: []")
    for g in entries:
        lines += _render_grant(g)
    return seal("\n".join(lines) + "\n")


def _render_grant(g: Grant) -> list[str]:
    """One grant's comment and entry; methods and paths always written (`["*"]`: all)."""
    until = f", until {format_utc(g.expires)}" if g.expires is not None else ""
    until += f", at most {g.max_uses} uses" if g.max_uses is not None else ""
    methods = sorted(g.methods) if g.methods is not None else [EVERY]
    paths = list(g.paths) if g.paths is not None else [EVERY]
    lines = [
        f"  # approval {g.id}: approved by {_comment_text(g.by, 100)} at {format_utc(g.at)}"
        f" (scope tenant{until})",
        f"  # why: {_comment_text(g.reason)}",
        f"  - id: {_scalar(g.id)}",  # quoted: an id of digits only would read as a number
        f"    host: {_scalar(g.host)}",
        f"    port: {g.port}",
        f"    methods: [{', '.join(_scalar(m) if m == EVERY else m for m in methods)}]",
        f"    paths: [{', '.join(_scalar(p) for p in paths)}]",
    ]
    if g.by is not None:
        lines.append(f"    approved_by: {_scalar(g.by)}")
    lines.append(f"    approved_at: {_scalar(format_utc(g.at))}")
    if g.reason is not None:
        lines.append(f"    reason: {_scalar(g.reason)}")
    if g.expires is not None:
        lines.append(f"    expires: {_scalar(format_utc(g.expires))}")
    if g.max_uses is not None:
        lines.append(f"    max_uses: {g.max_uses}")
    if g.tool is not None:
        lines.append(f"    tool: {_scalar(g.tool)}")
    if g.arguments_sha256 is not None:
        lines.append(f"    arguments_sha256: {_scalar(g.arguments_sha256)}")
    if g.arguments is not None:
        lines.append("    arguments:")
        lines += [f"      - {_flow(predicate_json(p))}" for p in g.arguments]
    return lines


def _flow(value: Any) -> str:
    """A JSON value as one line of YAML flow style that reads back as exactly it (strings as
    _scalar writes them; a float always with a '.', which YAML 1.1 needs to read a float)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_scalar(str(k))}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, str):
        return _scalar(value)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, float):
        return _float(value)
    return str(int(value))


def _float(value: float) -> str:
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + (f"e{exponent if exponent[0] in '+-' else '+' + exponent}" if e else "")


def predicate_json(predicate: ArgumentPredicate) -> dict[str, Any]:
    """An argument predicate as written (the fields it sets), for files, stores and views."""
    return predicate.model_dump(mode="json", exclude_unset=True)
