"""What changed when a registered sandbox was updated in place, for the log and the audit trail."""

from __future__ import annotations

import time

from sandgate.proxy.audit.records import new_decision_id
from sandgate.proxy.stores.registry import DynamicSandbox

__all__ = ["sandbox_changes", "sandbox_update_record"]

_FIELDS = ("tenant", "interface", "addresses", "token")


def sandbox_changes(old: DynamicSandbox, new: DynamicSandbox) -> list[str]:
    """The names of the fields that differ (a token is named, never shown)."""
    return [f for f in _FIELDS if getattr(old, f) != getattr(new, f)]


def sandbox_update_record(
    old: DynamicSandbox, new: DynamicSandbox, changed: list[str], old_version: str, version: str
) -> dict[str, object]:
    """The `sandbox_update` audit record: ids, tenants and addresses; token digests never."""
    return {
        "event": "sandbox_update",
        "v": 1,
        "time": time.time(),
        "decision_id": new_decision_id(),
        "sandbox": new.id,
        "old_tenant": old.tenant,
        "tenant": new.tenant,
        "changed": changed,
        "old": _view(old),
        "new": _view(new),
        "old_version": old_version,
        "policy_version": version,
    }


def _view(s: DynamicSandbox) -> dict[str, object]:
    return {
        "tenant": s.tenant,
        "interface": s.interface,
        "addresses": list(s.addresses),
        "token": s.token is not None,
    }
