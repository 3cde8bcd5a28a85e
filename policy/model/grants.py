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

    tenant: t1
    grants:
      # approval 3f9c...: approved by alice at 2026-12-01T22:40:00Z (scope tenant)
      # why: "the build needs the package index"
      - id: 3f9c...
        host: api.test
        port: 443
        methods: [GET]
        paths: [/v1/items]
        approved_by: alice
        approved_at: "2026-12-01T22:40:00Z"
        reason: the build needs the package index
        expires: "2026-12-02T22:40:00Z"   # optional
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sandgate.policy.errors import HostError
from sandgate.policy.hosts import normalise_host, parse_ip_literal
from sandgate.policy.matcher import CompiledRule, compile_path_globs
from sandgate.policy.model.tenant import NAME_PATTERN, check_method, check_path_glob

__all__ = [
    "APPROVAL_ID",
    "EMPTY_GRANTS",
    "Grant",
    "GrantEntry",
    "Grants",
    "GrantsFile",
    "exact_path_problem",
    "format_utc",
    "grant_from_entry",
    "parse_utc",
    "render_grants_file",
]

# An approval (access request) id: lower-case hex, as sandgate.proxy.audit mints decision ids.
APPROVAL_ID = r"^[0-9a-f]{12,64}$"


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
    rule: CompiledRule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ip = parse_ip_literal(self.host)
        rule = CompiledRule(
            rule_id=self.rule_id,
            ports=frozenset({self.port}),
            methods=self.methods,
            paths=compile_path_globs(self.paths) if self.paths is not None else None,
            inspect=self.methods is not None or self.paths is not None,
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
        """Whether it allows this request (at a CONNECT, method and path are None: not yet known)."""
        r = self.rule
        return (
            self.live(now)
            and host == self.host
            and r.port_ok(port)
            and r.method_ok(method)
            and r.path_ok(path)
            and r.upgrade_ok(upgrade)
        )

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
            "by": self.by,
            "at": format_utc(self.at),
            "reason": self.reason,
            "origin": self.origin,
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
            "by": self.by,
            "at": self.at,
            "reason": self.reason,
        }

    @staticmethod
    def from_json(data: dict[str, Any], origin: str) -> Grant:
        """A stored grant (ValueError, KeyError or TypeError when malformed)."""
        methods, paths = data.get("methods"), data.get("paths")
        entry = GrantEntry(
            id=str(data["id"]),
            host=str(data["host"]),
            port=int(data["port"]),
            methods=[str(m) for m in methods] if methods is not None else None,
            paths=[str(p) for p in paths] if paths is not None else None,
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
        )


class Grants:
    """A set of grants, indexed by (tenant, host): a lookup is one dict access."""

    __slots__ = ("_all", "_by_host")

    def __init__(self, grants: Iterable[Grant] = ()) -> None:
        self._all: tuple[Grant, ...] = tuple(grants)
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
    ) -> Grant | None:
        """The first live grant of `tenant` (for the whole tenant, or for `sandbox`) that allows it."""
        for g in self._by_host.get((tenant, host), ()):
            ours = g.sandbox is None or g.sandbox == sandbox
            if ours and g.matches(host, port, method, path, upgrade, now):
                return g
        return None

    def names_host(self, tenant: str, sandbox: str, host: str, now: float) -> bool:
        """Whether a live grant of `tenant` (for `sandbox`, or the whole tenant) names `host`."""
        return any(
            (g.sandbox is None or g.sandbox == sandbox) and g.live(now)
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


class GrantEntry(BaseModel):
    """One grant as a grants file writes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(pattern=APPROVAL_ID, description="the approval (access request) id")]
    host: Annotated[str, AfterValidator(_check_host), Field(description="one exact host")]
    port: Annotated[int, Field(ge=1, le=65535)]
    methods: list[Annotated[str, AfterValidator(check_method)]] | None = Field(default=None, min_length=1)
    paths: list[Annotated[str, AfterValidator(check_path_glob)]] | None = Field(default=None, min_length=1)
    approved_by: Annotated[str, Field(max_length=200)] | None = None
    approved_at: _Time | None = None
    reason: Annotated[str, Field(max_length=2000)] | None = None
    expires: _Time | None = Field(default=None, description="when it stops allowing (UTC); none: never")


class GrantsFile(BaseModel):
    """A tenant's grants file (`<tenants dir>/<tenant>.grants.yaml`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: Annotated[str, Field(pattern=NAME_PATTERN)]
    grants: list[GrantEntry] = Field(default_factory=list)


def grant_from_entry(tenant: str, entry: GrantEntry, origin: str) -> Grant:
    """A grants file's entry as a tenant-wide grant."""
    return Grant(
        id=entry.id,
        tenant=tenant,
        sandbox=None,
        host=entry.host,
        port=entry.port,
        methods=frozenset(entry.methods) if entry.methods is not None else None,
        paths=tuple(entry.paths) if entry.paths is not None else None,
        expires=parse_utc(entry.expires) if entry.expires is not None else None,
        by=entry.approved_by,
        at=parse_utc(entry.approved_at) if entry.approved_at is not None else 0.0,
        reason=entry.reason,
        origin=origin,
    )


# A path a held request asked for becomes a grant's glob as is: only where no character in it
# reads as a glob (`*`; `?` never reaches a path), so the grant allows exactly that path.
_GLOB_CHARS = re.compile(r"[*?]")


def exact_path_problem(path: str) -> str | None:
    """Why `path` cannot be granted as one exact path, or None."""
    if _GLOB_CHARS.search(path):
        return f"{path!r} has '*', which a grant would read as a glob: approve it once, or add an allow rule"
    return None


_UNSAFE_IN_COMMENT = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\x85]+")


def _comment_text(text: str | None, limit: int = 300) -> str:
    """Text on one comment line: control characters and line breaks folded to a space."""
    if not text:
        return "-"
    flat = _UNSAFE_IN_COMMENT.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _scalar(value: str) -> str:
    """A YAML scalar that reads back as exactly `value` (a JSON string is a YAML one)."""
    return json.dumps(value)


def render_grants_file(tenant: str, grants: Iterable[Grant]) -> str:
    """A tenant's grants file: each grant with a comment saying who approved it, when, why, and
    its approval id (sandgate.policy.model.grants documents the format)."""
    lines = [
        f"# Grants for tenant {tenant}: allow rules approvals added (`sandgate requests approve",
        "# --scope tenant`). Written by the gateway; review it like code. A grant allows one host",
        "# and port (and the methods and paths it names); deny rules and the address guard still",
        "# refuse first. Remove an entry (or `sandgate requests revoke ID`) to withdraw it.",
        f"tenant: {tenant}",
    ]
    entries = sorted(grants, key=lambda g: (g.at, g.id))
    if not entries:
        lines.append("grants: []")
    else:
        lines.append("grants:")
    for g in entries:
        until = f", until {format_utc(g.expires)}" if g.expires is not None else ""
        lines.append(
            f"  # approval {g.id}: approved by {_comment_text(g.by, 100)} at {format_utc(g.at)}"
            f" (scope tenant{until})"
        )
        lines.append(f"  # why: {_comment_text(g.reason)}")
        lines.append(f"  - id: {g.id}")
        lines.append(f"    host: {_scalar(g.host)}")
        lines.append(f"    port: {g.port}")
        if g.methods is not None:
            lines.append(f"    methods: [{', '.join(sorted(g.methods))}]")
        if g.paths is not None:
            lines.append(f"    paths: [{', '.join(_scalar(p) for p in g.paths)}]")
        if g.by is not None:
            lines.append(f"    approved_by: {_scalar(g.by)}")
        lines.append(f"    approved_at: {_scalar(format_utc(g.at))}")
        if g.reason is not None:
            lines.append(f"    reason: {_scalar(g.reason)}")
        if g.expires is not None:
            lines.append(f"    expires: {_scalar(format_utc(g.expires))}")
    return "\n".join(lines) + "\n"
