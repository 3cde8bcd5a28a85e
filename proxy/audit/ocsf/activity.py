"""What the three network activity classes (HTTP, Network, DNS) share: endpoints, actor, rule,
verdict, bytes, duration, message, and the record's other fields under `unmapped`."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

from sandgate.proxy.audit.ocsf.base import OcsfClass, event_base
from sandgate.proxy.audit.ocsf.controls import actor, controls, firewall_rule, outcome
from sandgate.proxy.audit.ocsf.endpoints import dst_endpoint, listener_endpoint, src_endpoint

__all__ = ["NETWORK", "correlation", "message", "network_event", "unmapped"]

NETWORK = (4, "Network Activity")

# Fields an activity event carries in OCSF attributes (the rest go to `unmapped`); `prev`,
# the hash chain's link, belongs to the trail, not to the event.
_MAPPED = frozenset(
    {
        "event",
        "v",
        "prev",
        "time",
        "decision_id",
        "tenant",
        "sandbox",
        "client",
        "listener",
        "dest",
        "reason",
        "rule_id",
        "policy_version",
        "status",
        "bytes",
        "duration_ms",
        "detail",
    }
)


def unmapped(record: Mapping[str, Any], mapped: Collection[str] = _MAPPED) -> dict[str, Any]:
    """The record's fields without an OCSF home (empty ones left out), as written."""
    return {k: v for k, v in record.items() if k not in mapped and v is not None and v != [] and v != {}}


def correlation(record: Mapping[str, Any]) -> str | None:
    """What ties related events: the approval an `ask` chain shares, else the decision."""
    approval = record.get("approval")
    if isinstance(approval, Mapping) and approval.get("id"):
        return str(approval["id"])
    if record.get("approval_id"):
        return str(record["approval_id"])
    return str(record["of"]) if record.get("of") else str(record.get("decision_id") or "") or None


def message(record: Mapping[str, Any]) -> str:
    """One line: the verdict and reason code, and the gateway's detail when it gave one."""
    text = f"{record.get('decision') or 'decision'}: {record.get('reason') or '-'}"
    return f"{text} ({record['detail']})" if record.get("detail") else text


def network_event(
    record: Mapping[str, Any],
    cls: OcsfClass,
    activity: tuple[int, str],
    uid: str,
    *,
    mapped: Collection[str] = (),
) -> dict[str, Any]:
    """The event of a decision record in one of the network classes, without its class's own parts."""
    event = event_base(
        record, cls, activity, uid=uid, severity_id=outcome(record)[4], correlation=correlation(record)
    )
    event.update(controls(record))
    event["message"] = message(record)
    for key, value in (
        ("src_endpoint", src_endpoint(record)),
        ("dst_endpoint", dst_endpoint(record)),
        ("proxy_endpoint", listener_endpoint(record)),
        ("actor", actor(record)),
        ("firewall_rule", firewall_rule(record)),
        ("traffic", _traffic(record.get("bytes"))),
    ):
        if value:
            event[key] = value
    duration = record.get("duration_ms")
    if isinstance(duration, int | float) and math.isfinite(duration):
        event["duration"] = round(duration)
    extra = unmapped(record, _MAPPED | set(mapped))
    if extra:
        event["unmapped"] = extra
    return event


def _traffic(counted: object) -> dict[str, int] | None:
    """Bytes from the guest (`bytes_out`) and to it (`bytes_in`), and their sum."""
    if not isinstance(counted, Mapping):
        return None
    up, down = counted.get("up"), counted.get("down")
    out = {}
    if isinstance(up, int):
        out["bytes_out"] = up
    if isinstance(down, int):
        out["bytes_in"] = down
    if out:
        out["bytes"] = sum(out.values())
    return out or None
