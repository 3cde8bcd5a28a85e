"""5019 Device Config State Change: the gateway's own state changed: its policy reloaded, a
grant made, expired, revoked or exhausted, a registered sandbox updated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandgate.proxy.audit.ocsf.activity import correlation, unmapped
from sandgate.proxy.audit.ocsf.base import OcsfClass, event_base
from sandgate.proxy.audit.ocsf.controls import actor, firewall_rule, operator

__all__ = ["CONFIG_STATE_CHANGE", "config_state_change"]

CONFIG_STATE_CHANGE = OcsfClass(5019, "Device Config State Change", 5, "Discovery")
# The device whose configuration changed: the gateway.
_GATEWAY = {"type_id": 99, "type": "Egress gateway", "name": "sandgate"}
_MAPPED = frozenset({"v", "prev", "time", "decision_id", "tenant"})


def config_state_change(record: Mapping[str, Any], uid: str) -> dict[str, Any]:
    """The event of a `policy_reload`, `grant` or `sandbox_update` record."""
    kind = str(record.get("event"))
    failed = kind == "policy_reload" and record.get("result") != "ok"
    event = event_base(
        record,
        CONFIG_STATE_CHANGE,
        (1, "Log"),
        uid=uid,
        severity_id=3 if failed else 1,
        correlation=str(record["approval_id"]) if record.get("approval_id") else correlation(record),
    )
    event["device"] = dict(_GATEWAY)
    event["status_id"], event["status"] = (2, "Failure") if failed else (1, "Success")
    event["message"] = _message(kind, record)
    who = operator(record.get("by")) if kind == "grant" else None
    who = who or (actor(record) if kind == "sandbox_update" else None)
    if who:
        event["actor"] = who
    rule = firewall_rule(record) if kind == "grant" else None
    if rule:
        event["firewall_rule"] = rule
    extra = unmapped(record, _MAPPED)
    if extra:
        event["unmapped"] = extra
    return event


def _message(kind: str, record: Mapping[str, Any]) -> str:
    get = record.get
    if kind == "policy_reload":
        return f"policy reload ({get('trigger')}): {get('result')}, version {get('policy_version')}"
    if kind == "grant":
        return f"grant {get('action')}: {get('approval_id')} ({get('scope')}, rule {get('rule_id')})"
    changed = get("changed")
    changed = ", ".join(map(str, changed)) if isinstance(changed, list) and changed else "nothing"
    return f"sandbox {get('sandbox')} updated: {changed}"
