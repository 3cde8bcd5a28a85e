"""Every sandbox a gateway knows, whoever defined it: `sandbox list`, `policy status`, `/v1/status`.

A row says which tenant a sandbox belongs to, how it is identified (its proxy token's
reference, never the token; its interface and source addresses) and where it is defined
(a tenant file's file:line, the registry file, or redis). The running gateway answers with
the policy it serves; without one, the rules directory and the registry are loaded the way
the gateway would load them.
"""

from __future__ import annotations

from typing import Any

from sandgate.policy.errors import PolicySetError
from sandgate.policy.limiter import Limiter
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.stores.registry import DynamicSandbox, load_registry, merge_registry_lenient

__all__ = ["limits_used", "load_error_text", "rows_from_files", "sandbox_rows", "sandboxes_text"]

# A sha256: reference is shown this long in text (it is a digest, but a line is not a dump).
DIGEST_SHOWN = 12


def sandbox_rows(policy: PolicySet) -> list[dict[str, Any]]:
    """The sandboxes `policy` identifies, by tenant then id, as JSON-ready rows."""
    return [
        {
            "id": r.sandbox,
            "tenant": r.tenant,
            "token": r.token_ref,
            "interface": r.interface,
            "addresses": list(r.addresses),
            "defined_in": r.origin,
        }
        for r in sorted(policy.sandboxes.values(), key=lambda r: (r.tenant, r.sandbox))
    ]


def limits_used(policy: PolicySet, limiter: Limiter) -> list[dict[str, Any]]:
    """Each rate and byte limit in force and how much of it is used now (this gateway's view:
    its counts plus what the fleet or its workers last told it), a sandbox's own and, once per
    tenant, the tenant's (`sandbox` None)."""
    rows: list[dict[str, Any]] = []
    tenants_done: set[str] = set()
    for r in sorted(policy.sandboxes.values(), key=lambda r: (r.tenant, r.sandbox)):
        tenant = policy.tenant(r.tenant)
        for name, used, limit in limiter.used(r.tenant, r.sandbox, tenant.limits if tenant else None):
            whole_tenant = name.startswith("tenant_")
            if whole_tenant and r.tenant in tenants_done:
                continue
            rows.append(
                {
                    "tenant": r.tenant,
                    "sandbox": None if whole_tenant else r.sandbox,
                    "limit": name,
                    "used": round(used),
                    "of": limit,
                }
            )
        tenants_done.add(r.tenant)
    return rows


def rows_from_files(
    config: GatewayConfig, fleet: list[DynamicSandbox] | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows a gateway started now would serve, and notes on what it would leave out
    (broken tenant files, refused registry entries). A broken operator file raises
    PolicySetError, as it stops the gateway's start."""
    policy = load_policy_dir(config.rules_path, isolate=not config.strict_policy)
    notes = [f"{p.file} did not load: its sandboxes are not listed" for p in policy.problems]
    merged, refused = merge_registry_lenient(
        policy, load_registry(config.registry_path), str(config.registry_path)
    )
    if fleet:
        merged, more = merge_registry_lenient(merged, fleet, "redis sandbox registry")
        refused += more
    notes += [f"registry entry refused: {e}" for e in refused]
    notes += [str(n) for n in policy.notices]
    return sandbox_rows(merged), notes


def _identified_by(row: dict[str, Any]) -> str:
    parts = []
    token = row.get("token")
    if token:
        if token.startswith("sha256:") and len(token) > 7 + DIGEST_SHOWN:
            token = token[: 7 + DIGEST_SHOWN] + "…"
        parts.append(f"token {token}")
    if row.get("interface"):
        parts.append(f"interface {row['interface']}")
    addresses = row.get("addresses") or []
    if addresses:
        parts.append(("address " if len(addresses) == 1 else "addresses ") + ",".join(addresses))
    return ", ".join(parts) or "-"


def sandboxes_text(rows: list[dict[str, Any]]) -> str:
    """A table (sandbox, tenant, identified by, defined in), or "no sandboxes"."""
    if not rows:
        return "no sandboxes"
    table = [("SANDBOX", "TENANT", "IDENTIFIED BY", "DEFINED IN")]
    table += [(r["id"], r["tenant"], _identified_by(r), r.get("defined_in") or "-") for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line[:3], widths, strict=True)) + "  " + line[3]
        for line in table
    )


def load_error_text(e: PolicySetError) -> str:
    return "the policy does not load, so no sandbox is served:\n" + "\n".join(f"  {x}" for x in e.errors)
