"""2004 Detection Finding: what a security team wants raised, beside the activity event that
recorded it: a placeholder sent where it is not bound or forged, an address-guard refusal, a
DNS query the exfiltration control refused, a destination that does not match what the guest
claimed, HTTP/2 protocol abuse, and a real secret scrubbed from a response."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandgate.proxy.audit.ocsf.activity import correlation, unmapped
from sandgate.proxy.audit.ocsf.base import OcsfClass, event_base
from sandgate.proxy.audit.ocsf.controls import actor, controls, firewall_rule
from sandgate.proxy.audit.ocsf.endpoints import dst_endpoint, src_endpoint

__all__ = ["DETECTION_FINDING", "FINDINGS", "SECRET_SCRUBBED", "decision_finding", "scrub_finding"]

DETECTION_FINDING = OcsfClass(2004, "Detection Finding", 2, "Findings")
SECRET_SCRUBBED = "secret_scrubbed"  # noqa: S105 (a finding kind, no secret)


# The reason codes of a denial (or a report-mode would-deny) that are findings.
FINDINGS: Mapping[str, tuple[str, str, int]] = {
    "credential_host_mismatch": (
        "credential_misuse",
        "A credential placeholder was sent where its credential is not bound",
        4,
    ),
    "unknown_placeholder": ("credential_misuse", "A placeholder this gateway did not mint was sent", 4),
    "private_address": ("address_guard", "The address guard refused an internal destination", 3),
    "dns_denied": ("dns_exfiltration", "A DNS query for a name the tenant cannot reach was refused", 2),
    "sni_mismatch": ("destination_mismatch", "The TLS SNI does not name the CONNECT host", 3),
    "host_mismatch": ("destination_mismatch", "The HTTP Host does not name the connection's destination", 3),
    "protocol_abuse": ("protocol_abuse", "An HTTP/2 connection reset or overran streams (rapid reset)", 3),
}
_SCRUBBED = (SECRET_SCRUBBED, "An upstream sent a real secret back; the guest got its placeholder", 3)
# Scrubbing changed what the guest got: no policy verdict, a modification.
_MODIFIED = {
    "action_id": 4,
    "action": "Modified",
    "disposition_id": 99,
    "disposition": "Scrubbed",
    "status_id": 1,
    "status": "Success",
    "status_detail": SECRET_SCRUBBED,
}
_FINDING_MAPPED = frozenset({"v", "prev", "time", "tenant", "sandbox", "client", "rule_id", "policy_version"})


def decision_finding(record: Mapping[str, Any], uid: str) -> dict[str, Any] | None:
    """The finding a denied (or would-deny) decision raises, or None when its reason raises none."""
    if record.get("decision") not in ("deny", "would_deny"):
        return None
    found = FINDINGS.get(str(record.get("reason")))
    if found is None:
        return None
    event = _finding(record, uid, found)
    event.update(controls(record))
    return event


def scrub_finding(record: Mapping[str, Any], uid: str) -> dict[str, Any]:
    """The finding of a `secret_scrubbed` record (sandgate.proxy.addons.credential_broker)."""
    event = _finding(record, uid, _SCRUBBED)
    event.update(_MODIFIED)
    return event


def _finding(record: Mapping[str, Any], uid: str, found: tuple[str, str, int]) -> dict[str, Any]:
    kind, title, severity_id = found
    event = event_base(
        record,
        DETECTION_FINDING,
        (1, "Create"),
        uid=uid,
        severity_id=severity_id,
        correlation=correlation(record),
    )
    info: dict[str, Any] = {"uid": uid, "title": title, "types": [kind]}
    if record.get("detail"):
        info["desc"] = str(record["detail"])
    event["finding_info"] = info
    event["message"] = title
    evidence: dict[str, Any] = {"name": kind}
    for key, value in (("src_endpoint", src_endpoint(record)), ("dst_endpoint", dst_endpoint(record))):
        if value:
            evidence[key] = value
    if len(evidence) > 1:
        event["evidences"] = [evidence]
    for key, value in (("actor", actor(record)), ("firewall_rule", firewall_rule(record))):
        if value:
            event[key] = value
    extra = unmapped(record, _FINDING_MAPPED)
    if extra:
        event["unmapped"] = extra
    return event
