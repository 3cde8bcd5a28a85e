"""The OCSF 1.8.0 events of one audit-trail record: which classes a record maps to.

    decision, phase request            4002 HTTP Activity
    decision, phase connect or tls     4001 Network Activity
    decision, phase dns                4003 DNS Activity
      and, for a denial whose reason is a finding (detection_finding.FINDINGS),
                                       2004 Detection Finding, uid `<decision_id>:finding`
    finding (secret_scrubbed)          2004 Detection Finding
    policy_reload, grant, sandbox_update
                                       5019 Device Config State Change
    checkpoint, chain_restart, others  none (the trail's own lines)

An event's `metadata.uid` is the record's `decision_id` (every written record has one), so a
sink that delivers an event twice delivers the same uid; `metadata.correlation_uid` ties the
events of one exchange (the decision id) or one approval (its id).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sandgate.proxy.audit.ocsf.base import OCSF_VERSION, record_uid
from sandgate.proxy.audit.ocsf.config_state import config_state_change
from sandgate.proxy.audit.ocsf.detection_finding import SECRET_SCRUBBED, decision_finding, scrub_finding
from sandgate.proxy.audit.ocsf.dns_activity import dns_activity
from sandgate.proxy.audit.ocsf.http_activity import http_activity
from sandgate.proxy.audit.ocsf.network_activity import network_activity

__all__ = ["OCSF_VERSION", "ocsf_events"]

Event = dict[str, Any]

_BY_PHASE: Mapping[str, Callable[[Mapping[str, Any], str], Event]] = {
    "request": http_activity,
    "connect": network_activity,
    "tls": network_activity,
    "dns": dns_activity,
}
_CONFIG = frozenset({"policy_reload", "grant", "sandbox_update"})


def ocsf_events(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The OCSF 1.8.0 events for one audit-trail record (a parsed trail line, as written:
    `time` an RFC 3339 string), each with a stable `metadata.uid` (the same record always
    gives the same uids), [] for records that are no events (checkpoints)."""
    kind = str(record.get("event"))
    uid = record_uid(record)
    if kind == "decision":
        activity = _BY_PHASE.get(str(record.get("phase")), http_activity)
        finding = decision_finding(record, f"{uid}:finding")
        return [activity(record, uid)] + ([finding] if finding is not None else [])
    if kind in _CONFIG:
        return [config_state_change(record, uid)]
    if kind == "finding" and record.get("kind") == SECRET_SCRUBBED:
        return [scrub_finding(record, uid)]
    return []
