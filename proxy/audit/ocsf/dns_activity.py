"""4003 DNS Activity: the DNS listener's answer to, or refusal of, a guest's query."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandgate.proxy.audit.ocsf.activity import NETWORK, network_event
from sandgate.proxy.audit.ocsf.base import OcsfClass
from sandgate.proxy.audit.ocsf.endpoints import listener_endpoint

__all__ = ["DNS_ACTIVITY", "dns_activity"]

DNS_ACTIVITY = OcsfClass(4003, "DNS Activity", *NETWORK)
# The response code the listener answers with, by the record's reason (sandgate.proxy.dns.listener):
# an allowed name and one whose every address the guard refused get NOERROR (the latter empty).
_RCODES = {
    "allowed": (0, "NoError"),
    "private_address": (0, "NoError"),
    "no_identity": (5, "Refused"),
    "dns_failure": (2, "ServError"),
}
_NXDOMAIN = (3, "NXDomain")


def dns_activity(record: Mapping[str, Any], uid: str) -> dict[str, Any]:
    """The event of one answered query: the name and type asked, the response code."""
    event = network_event(record, DNS_ACTIVITY, (2, "Response"), uid, mapped=("method", "path"))
    dest = record.get("dest")
    name = dest.get("host") if isinstance(dest, Mapping) else None
    if name:
        query = {"hostname": str(name), "class": "IN"}
        if record.get("method"):
            query["type"] = str(record["method"])
        event["query"] = query
    rcode_id, rcode = _RCODES.get(str(record.get("reason")), _NXDOMAIN)
    event["rcode_id"], event["rcode"] = rcode_id, rcode
    # The guest asked the listener: that is the server end of the exchange.
    event.pop("dst_endpoint", None)  # the record's `dest` is the name asked, no endpoint
    server = listener_endpoint(record)
    if server is not None and "ip" in server:
        event["dst_endpoint"] = {k: v for k, v in server.items() if k in ("ip", "port")}
    return event
