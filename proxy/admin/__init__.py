"""The admin API: a unix socket (and optional TCP with a bearer token), its routes, and the
CLI's client.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "access_requests",
    "client",
    "fanout",
    "fleet_requests",
    "handlers",
    "metrics_merge",
    "peers",
    "server",
    "state",
]
