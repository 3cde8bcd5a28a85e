"""Sandboxes that tenant files put on interfaces: the host rules the gateway owns for them.

The gateway installs their rules (proxy/net/nft.py) at start and after every reload, together
with the registry's, in one nft transaction. What it last installed is kept in
`<state_dir>/static-sandboxes.json`, so `sandbox add|remove` (with or without a gateway)
rewrite the one table without dropping them, and a tenant file that stops loading keeps its
interface sandboxes' rules (fail closed: never forwarded, never spoofable) until it loads again.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from sandgate.policy.model.policyset import PolicySet

__all__ = ["StaticSandbox", "desired_static", "load_static", "save_static", "static_from_policy"]


@dataclass(frozen=True, slots=True)
class StaticSandbox:
    """A tenant file's sandbox on a host interface, and the file that declares it."""

    id: str
    tenant: str
    interface: str
    addresses: tuple[str, ...]
    file: str


def static_from_policy(policy: PolicySet) -> list[StaticSandbox]:
    """The interface sandboxes of every tenant the policy serves (kept last good versions too)."""
    out = [
        StaticSandbox(r.sandbox, r.tenant, r.interface, r.addresses, tenant.source)
        for tenant in policy.tenants.values()
        for r in tenant.sandboxes
        if r.interface is not None and r.addresses
    ]
    return sorted(out, key=lambda s: s.id)


def desired_static(policy: PolicySet, installed: list[StaticSandbox]) -> list[StaticSandbox]:
    """What to install: the policy's, plus the installed entries of tenant files that broke
    with no last good version to serve (their guests stay behind the rules, unidentified)."""
    current = static_from_policy(policy)
    broken = {p.file for p in policy.problems if not p.kept_last_good}
    ids = {s.id for s in current}
    interfaces = {s.interface for s in current}
    addresses = {a for s in current for a in s.addresses}
    kept = [
        s
        for s in installed
        if s.file in broken
        and s.id not in ids
        and s.interface not in interfaces
        and not addresses.intersection(s.addresses)
    ]
    return sorted([*current, *kept], key=lambda s: s.id)


def load_static(path: Path) -> list[StaticSandbox]:
    """The interface sandboxes last installed (none when the file is absent or unreadable)."""
    try:
        raw = json.loads(path.read_text())
        return [
            StaticSandbox(e["id"], e["tenant"], e["interface"], tuple(e["addresses"]), e["file"]) for e in raw
        ]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError):
        # Written only by sandgate; a damaged copy is rewritten by the gateway's next sync.
        return []


def save_static(path: Path, entries: list[StaticSandbox]) -> None:
    """Replace the record atomically (mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps([asdict(e) for e in entries], indent=2) + "\n")
    tmp.replace(path)
