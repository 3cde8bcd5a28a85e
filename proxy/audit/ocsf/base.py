"""The parts every OCSF event has: class and activity, time, severity, metadata, the uid scheme."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sandgate.proxy.version import version_of

__all__ = [
    "OCSF_VERSION",
    "PROFILES",
    "OcsfClass",
    "event_base",
    "record_uid",
    "time_ms",
]

OCSF_VERSION = "1.8.0"
# The profiles whose attributes the events use: firewall_rule, action and disposition
# (security_control), proxy_endpoint (network_proxy), actor (host).
PROFILES = ("host", "network_proxy", "security_control")
_PRODUCT = {"name": "sandgate", "vendor_name": "sandgate", "version": version_of("sandgate")}
_SEVERITIES = {1: "Informational", 2: "Low", 3: "Medium", 4: "High"}


@dataclass(frozen=True, slots=True)
class OcsfClass:
    """One OCSF event class: its uid, name and category."""

    uid: int
    name: str
    category_uid: int
    category_name: str


def time_ms(record: Mapping[str, Any]) -> int:
    """A record's `time` (RFC 3339 as written, or epoch seconds before the writer renders it)
    in milliseconds since the epoch. A time that does not parse (a line damaged by hand) falls
    back to the one in its decision id (its first 12 hex digits), else 0: the mapping never
    raises, and the same record still gives the same event."""
    value = record.get("time")
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return round(value * 1000)
        return round(datetime.fromisoformat(str(value)).timestamp() * 1000)
    except (ValueError, OverflowError):
        did = str(record.get("decision_id") or "")
        return int(did[:12], 16) if re.fullmatch(r"[0-9a-f]{12}.*", did) else 0


def record_uid(record: Mapping[str, Any]) -> str:
    """The record's stable id: its `decision_id` (every written record has one), else a digest
    of its content (a record from elsewhere)."""
    did = record.get("decision_id")
    if did:
        return str(did)
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def event_base(
    record: Mapping[str, Any],
    cls: OcsfClass,
    activity: tuple[int, str],
    *,
    uid: str,
    severity_id: int,
    correlation: str | None,
) -> dict[str, Any]:
    """The header of one event: class, activity, type, time, severity and metadata."""
    activity_id, activity_name = activity
    metadata: dict[str, Any] = {
        "version": OCSF_VERSION,
        "product": dict(_PRODUCT),
        "profiles": list(PROFILES),
        "uid": uid,
        "log_name": "sandgate.audit",
        "event_code": str(record.get("event") or "decision"),
    }
    if record.get("time") is not None:
        metadata["original_time"] = str(record["time"])
    if correlation:
        metadata["correlation_uid"] = correlation
    tenant = record.get("tenant")
    if tenant:
        metadata["tenant_uid"] = str(tenant)
    return {
        "class_uid": cls.uid,
        "class_name": cls.name,
        "category_uid": cls.category_uid,
        "category_name": cls.category_name,
        "activity_id": activity_id,
        "activity_name": activity_name,
        "type_uid": cls.uid * 100 + activity_id,
        "type_name": f"{cls.name}: {activity_name}",
        "time": time_ms(record),
        "severity_id": severity_id,
        "severity": _SEVERITIES.get(severity_id, "Unknown"),
        "metadata": metadata,
    }
