"""The mitmproxy addons, one concern each, in the one order `pipeline` gives them (the
gateway's and the in-process tests'): identify the sandbox, decide at every layer (gate),
count tenant limits (limits), complete the audit record (audit_completion), broker
credentials, and the guards on connections, heads, HTTP/2 streams, upgrades and trailers;
`drain` lets requests in flight finish on shutdown.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "audit_completion",
    "connection_limits",
    "credentials",
    "drain",
    "flow_keys",
    "gate",
    "h2_guard",
    "head_caps",
    "hop_by_hop",
    "http_seam",
    "identify",
    "latency",
    "limits",
    "pipeline",
    "refusal",
    "trailers",
    "transparent",
    "upgrades",
]
