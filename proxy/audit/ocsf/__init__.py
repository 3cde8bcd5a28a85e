"""OCSF 1.8.0 events for the audit trail's records, for SIEMs: one pure mapping per class,
the common parts (metadata, endpoints, actor, rule, disposition) beside them.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "activity",
    "base",
    "config_state",
    "controls",
    "detection_finding",
    "dns_activity",
    "endpoints",
    "events",
    "http_activity",
    "network_activity",
]
