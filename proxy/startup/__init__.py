"""What the gateway checks and sets up before it serves: its banner, the port check, the CA,
the upstream trust store, the credential broker and resolver it is given, the descriptor
budget and logging.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "banner",
    "bindcheck",
    "broker_setup",
    "ca",
    "fd_budget",
    "logsetup",
    "resolver_setup",
    "upstream_trust",
]
