"""4001 Network Activity: a connection's decision (CONNECT, a transparent connection, raw TCP)
or its TLS ClientHello's (`tls.sni`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandgate.proxy.audit.ocsf.activity import NETWORK, network_event
from sandgate.proxy.audit.ocsf.base import OcsfClass

__all__ = ["NETWORK_ACTIVITY", "TLS_VERSION_UNKNOWN", "network_activity"]

NETWORK_ACTIVITY = OcsfClass(4001, "Network Activity", *NETWORK)
# OCSF requires `tls.version`; the trail does not record the ClientHello's.
TLS_VERSION_UNKNOWN = "unknown"
_TCP = {"direction_id": 2, "direction": "Outbound", "protocol_name": "tcp", "protocol_num": 6}


def _activity(record: Mapping[str, Any]) -> tuple[int, str]:
    verdict = record.get("decision")
    if verdict == "ask":
        return 99, "Held"
    if verdict in ("allow", "would_deny"):
        return (4, "Fail") if record.get("error") else (1, "Open")
    return 5, "Refuse"


def network_activity(record: Mapping[str, Any], uid: str) -> dict[str, Any]:
    """The event of a connection's or a ClientHello's decision."""
    event = network_event(record, NETWORK_ACTIVITY, _activity(record), uid, mapped=("method", "path"))
    event["connection_info"] = dict(_TCP)
    dest = record.get("dest")
    sni = dest.get("sni") if isinstance(dest, Mapping) else None
    if sni:
        event["tls"] = {"sni": str(sni), "version": TLS_VERSION_UNKNOWN}
    return event
