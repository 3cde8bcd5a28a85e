"""The dynamic sandbox registry: sandboxes registered at run time (`sandgate sandbox add`, jail).

Kept as `<state_dir>/sandboxes.json` (mode 0600, replaced atomically). The gateway merges it
into the policy on start and on every reload; a change to the file triggers a reload.
Static sandboxes (tenant files) win: a dynamic entry may not reuse their ids or addresses.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from sandgate.policy.errors import PolicyLoadError, PolicySetError, SourceLocation
from sandgate.policy.models import NAME_PATTERN
from sandgate.policy.policyset import PolicySet, SandboxRecord

__all__ = ["DynamicSandbox", "load_registry", "merge_registry", "registry_digest", "save_registry"]

_IFNAME = r"^[A-Za-z0-9_.:-]{1,15}$"


class DynamicSandbox(BaseModel):
    """A sandbox registered at run time, identified by its interface and source address."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(pattern=NAME_PATTERN)]
    tenant: Annotated[str, Field(pattern=NAME_PATTERN)]
    interface: Annotated[str, Field(pattern=_IFNAME)] | None = None
    address: str

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        return str(ipaddress.ip_address(v))


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
        f.write(json.dumps([s.model_dump() for s in sandboxes], indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def registry_digest(sandboxes: list[DynamicSandbox]) -> str:
    """A short digest of the registry, to tell when a gateway has picked a change up."""
    text = json.dumps([s.model_dump() for s in sorted(sandboxes, key=lambda s: s.id)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def merge_registry(policy: PolicySet, sandboxes: list[DynamicSandbox], path: Path) -> PolicySet:
    """The policy with the dynamic sandboxes added; raises PolicySetError on conflicts."""
    if not sandboxes:
        return policy
    by_id = dict(policy.sandboxes)
    by_address = dict(policy.by_address)
    errors = []
    for i, sb in enumerate(sandboxes):
        where = SourceLocation(str(path))
        if sb.tenant not in policy.tenants:
            errors.append(PolicyLoadError(where, f"{i}.tenant", f"unknown tenant {sb.tenant!r}"))
            continue
        if sb.id in by_id:
            errors.append(PolicyLoadError(where, f"{i}.id", f"sandbox {sb.id!r} is already registered"))
            continue
        if sb.address in by_address:
            owner = by_address[sb.address].sandbox
            errors.append(
                PolicyLoadError(where, f"{i}.address", f"address {sb.address} belongs to {owner!r}")
            )
            continue
        record = SandboxRecord(sb.id, sb.tenant, None, (sb.address,))
        by_id[sb.id] = record
        by_address[sb.address] = record
    if errors:
        raise PolicySetError(errors)
    return replace(
        policy,
        sandboxes=by_id,
        by_address=by_address,
        version=f"{policy.version}+{registry_digest(sandboxes)[:6]}",
    )
