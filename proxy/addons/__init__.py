"""The mitmproxy addons, one concern each, in the order `runtime` adds them: identify the
sandbox, decide at every layer (gate), broker credentials, and the guards on connections,
heads, HTTP/2 streams, upgrades and trailers.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "connection_limits",
    "credentials",
    "gate",
    "h2_guard",
    "head_caps",
    "hop_by_hop",
    "http_seam",
    "identify",
    "latency",
    "limits",
    "refusal",
    "transparent",
    "upgrades",
]
