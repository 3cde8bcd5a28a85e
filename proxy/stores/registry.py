"""The dynamic sandbox registry: sandboxes registered at run time (`sandgate sandbox add`, jail).

Kept as `<state_dir>/sandboxes.json` (mode 0600, replaced atomically) on one machine, and in
redis in a fleet (proxy/stores/registry_redis.py). The gateway merges it into the policy on start
and on every reload; a change to the file triggers a reload. A sandbox is identified by its
source addresses (transparent mode; IPv4 and IPv6, several per sandbox), by its proxy
token (explicit proxy, kept only as a `sha256:` digest), or both. Static sandboxes (tenant
files) win: a dynamic entry may not reuse their ids or addresses.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    field_validator,
    model_serializer,
    model_validator,
)

from sandgate.policy.errors import PolicyLoadError, PolicySetError, SourceLocation
from sandgate.policy.model.policyset import PolicySet, SandboxRecord
from sandgate.policy.model.source_addresses import source_addresses
from sandgate.policy.model.tenant import IFNAME_PATTERN, NAME_PATTERN

__all__ = [
    "DynamicSandbox",
    "already_registered",
    "load_registry",
    "merge_registry",
    "merge_registry_lenient",
    "registry_digest",
    "save_registry",
]

_TOKEN_DIGEST = r"^sha256:[0-9a-f]{64}$"  # noqa: S105 (a pattern, not a secret)


class DynamicSandbox(BaseModel):
    """A sandbox registered at run time: its source addresses, its proxy token's digest, or both.

    Registry files and API bodies written before several addresses existed carry one
    `address`; it is read as `addresses: [address]` (and written back as `addresses`)."""

    # hide_input_in_errors: a raw token sent by mistake must not come back in the error.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    id: Annotated[str, Field(pattern=NAME_PATTERN)]
    tenant: Annotated[str, Field(pattern=NAME_PATTERN)]
    interface: Annotated[str, Field(pattern=IFNAME_PATTERN)] | None = None
    addresses: tuple[str, ...] = Field(
        default=(), description="source addresses, IPv4 and IPv6 (each canonical, distinct, at most 16)"
    )
    token: Annotated[str | None, Field(pattern=_TOKEN_DIGEST)] = Field(
        default=None,
        repr=False,
        description="the proxy token's digest, 'sha256:<64 lowercase hex>' (never the token)",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_address(cls, data: object) -> object:
        if isinstance(data, dict) and "address" in data:
            if "addresses" in data:
                raise ValueError("give addresses (a list), not address as well")
            data = dict(data)
            one = data.pop("address")
            data["addresses"] = [] if one is None else [one]
        return data

    @field_validator("addresses", mode="before")
    @classmethod
    def _addresses(cls, v: object) -> object:
        if isinstance(v, str):
            raise ValueError("addresses is a list of addresses")
        return source_addresses(v) if isinstance(v, (list, tuple)) else v

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        out: dict[str, object] = handler(self)
        # Token-only entries dump (and digest) as they did before addresses were a list.
        if not out.get("addresses"):
            out.pop("addresses", None)
        return out

    @field_validator("token", mode="before")
    @classmethod
    def _token(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) and v.lower().startswith("sha256:") else v

    @model_validator(mode="after")
    def _identified(self) -> DynamicSandbox:
        if not self.addresses and self.token is None:
            raise ValueError("a sandbox needs an address, a token digest, or both")
        if self.interface is not None and not self.addresses:
            raise ValueError("a sandbox on an interface needs its addresses (for the anti-spoofing rule)")
        return self

    @property
    def token_digest(self) -> bytes | None:
        """The token digest as bytes (what SandboxRecord compares against)."""
        return bytes.fromhex(self.token.removeprefix("sha256:")) if self.token else None


def already_registered(existing: DynamicSandbox) -> str:
    """The one wording of "taken id" for `sandbox add`, with a gateway or without."""
    return (
        f"sandbox {existing.id!r} is already registered with other settings (tenant {existing.tenant!r});"
        f" change it with `sandgate sandbox update {existing.id}` or `sandbox add --replace`"
    )


_LIST = TypeAdapter(list[DynamicSandbox])


def load_registry(path: Path) -> list[DynamicSandbox]:
    """The registered sandboxes (an absent file is an empty registry)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        return _LIST.validate_json(raw)
    except ValueError as e:
        raise PolicyLoadError(SourceLocation(str(path)), "", f"invalid sandbox registry: {e}") from None


def save_registry(path: Path, sandboxes: list[DynamicSandbox]) -> None:
    """Replace the registry file atomically (mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps([s.model_dump(exclude_none=True) for s in sandboxes], indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def registry_digest(sandboxes: list[DynamicSandbox]) -> str:
    """A short digest of the registry, to tell when a gateway has picked a change up."""
    # exclude_none: entries without a token keep the digest they had before tokens existed.
    entries = [s.model_dump(exclude_none=True) for s in sorted(sandboxes, key=lambda s: s.id)]
    text = json.dumps(entries, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def merge_registry(policy: PolicySet, sandboxes: list[DynamicSandbox], path: Path) -> PolicySet:
    """The policy with the dynamic sandboxes added; raises PolicySetError on conflicts."""
    merged, errors = merge_registry_lenient(policy, sandboxes, str(path))
    if errors:
        raise PolicySetError(errors)
    return merged


def merge_registry_lenient(
    policy: PolicySet, sandboxes: list[DynamicSandbox], source: str
) -> tuple[PolicySet, list[PolicyLoadError]]:
    """The policy with every dynamic sandbox that fits added, and an error for each one that
    does not (unknown tenant, taken id, or an address another sandbox has). A fleet registry
    uses this: one bad entry written by another host must not stop this gateway from reloading."""
    if not sandboxes:
        return policy, []
    by_id = dict(policy.sandboxes)
    by_address = dict(policy.by_address)
    by_interface = {r.interface: r for r in by_id.values() if r.interface is not None}
    errors = []
    accepted = []
    where = SourceLocation(source)

    def defined(owner: SandboxRecord) -> str:
        """Where a taken id, address or interface is defined: its tenant file, or this registry."""
        tenant = policy.tenants.get(owner.tenant)
        static = tenant is not None and owner in tenant.sandboxes
        return f"in tenant file {tenant.source}" if static and tenant else f"in {source}"

    for i, sb in enumerate(sandboxes):
        if sb.tenant not in policy.tenants:
            errors.append(PolicyLoadError(where, f"{i}.tenant", f"unknown tenant {sb.tenant!r}"))
            continue
        if sb.id in by_id:
            problem = f"sandbox {sb.id!r} is already registered ({defined(by_id[sb.id])})"
            errors.append(PolicyLoadError(where, f"{i}.id", problem))
            continue
        taken = next((a for a in sb.addresses if a in by_address), None)
        if taken is not None:
            owner = by_address[taken]
            problem = f"address {taken} belongs to {owner.sandbox!r} ({defined(owner)})"
            errors.append(PolicyLoadError(where, f"{i}.addresses", problem))
            continue
        if sb.interface is not None and sb.interface in by_interface:
            owner = by_interface[sb.interface]
            problem = f"interface {sb.interface} carries sandbox {owner.sandbox!r} ({defined(owner)})"
            errors.append(PolicyLoadError(where, f"{i}.interface", problem))
            continue
        record = SandboxRecord(
            sb.id,
            sb.tenant,
            sb.token_digest,
            sb.addresses,
            sb.interface,
            origin="redis" if source.startswith("redis") else f"registry {source}",
            token_ref=sb.token,
        )
        by_id[sb.id] = record
        by_address.update((a, record) for a in sb.addresses)
        if sb.interface is not None:
            by_interface[sb.interface] = record
        accepted.append(sb)
    if not accepted:
        return policy, errors
    merged = replace(
        policy,
        sandboxes=by_id,
        by_address=by_address,
        version=f"{policy.version}+{registry_digest(accepted)[:6]}",
    )
    return merged, errors
