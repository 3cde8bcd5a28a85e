"""What the gateway did and on whose behalf: action and disposition from the verdict (approvals
too), status, severity, the rule that decided (`firewall_rule`) and the sandbox (`actor`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["Outcome", "actor", "controls", "firewall_rule", "operator", "outcome"]

# (action_id, action, disposition_id, disposition, severity_id)
Outcome = tuple[int, str, int, str, int]

_ALLOWED: Outcome = (1, "Allowed", 1, "Allowed", 1)
_APPROVED: Outcome = (1, "Allowed", 8, "Approved", 1)
# Report mode: the policy would deny, the gateway let it through and recorded it.
_OBSERVED: Outcome = (3, "Observed", 15, "Detected", 2)
# An `ask`: held until an operator (or a timeout) decides.
_HELD: Outcome = (99, "Held", 14, "Delayed", 1)
_BLOCKED: Outcome = (2, "Denied", 2, "Blocked", 2)
_REJECTED: Outcome = (2, "Denied", 25, "Rejected", 2)
_ERROR: Outcome = (2, "Denied", 27, "Error", 3)

_REJECTIONS = frozenset({"approval_denied", "approval_timeout"})
_FAULTS = frozenset({"internal_error", "policy_error"})


def outcome(record: Mapping[str, Any]) -> Outcome:
    """The action and disposition of a decision record, and its severity."""
    verdict = record.get("decision")
    if verdict == "allow":
        return _APPROVED if record.get("approval") else _ALLOWED
    if verdict == "would_deny":
        return _OBSERVED
    if verdict == "ask":
        return _HELD
    reason = str(record.get("reason"))
    if reason in _REJECTIONS:
        return _REJECTED
    return _ERROR if reason in _FAULTS else _BLOCKED


def controls(record: Mapping[str, Any]) -> dict[str, Any]:
    """action, disposition, status and status_detail (the reason code) of a decision record."""
    action_id, action, disposition_id, disposition, _ = outcome(record)
    reason = record.get("reason")
    succeeded = record.get("decision") == "allow" and reason == "allowed" and not record.get("error")
    out: dict[str, Any] = {
        "action_id": action_id,
        "action": action,
        "disposition_id": disposition_id,
        "disposition": disposition,
        "status_id": 1 if succeeded else 2,
        "status": "Success" if succeeded else "Failure",
    }
    if reason:
        out["status_detail"] = str(reason)
    return out


def actor(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The sandbox that acted (a user of type Other, "Sandbox") in its tenant (the user's org)."""
    sandbox, tenant = record.get("sandbox"), record.get("tenant")
    if not sandbox:
        return None
    user: dict[str, Any] = {"uid": str(sandbox), "name": str(sandbox), "type_id": 99, "type": "Sandbox"}
    if tenant:
        user["org"] = {"uid": str(tenant), "name": str(tenant)}
    return {"user": user}


def operator(by: object) -> dict[str, Any] | None:
    """Who changed the gateway's state (an operator, or `sandgate` itself), as an actor."""
    if not by:
        return None
    return {"user": {"name": str(by), "type_id": 2, "type": "Admin"}}


def firewall_rule(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The rule that decided: its id, the policy version it was in, its tenant as category."""
    rule_id = record.get("rule_id")
    if not rule_id:
        return None
    rule: dict[str, Any] = {"uid": str(rule_id), "name": str(rule_id)}
    if record.get("policy_version"):
        rule["version"] = str(record["policy_version"])
    if record.get("tenant"):
        rule["category"] = str(record["tenant"])
    return rule
