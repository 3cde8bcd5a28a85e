"""What changes while the gateway runs: the policy files reloaded, credential secrets refreshed."""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "reloader",
    "secret_refresh",
]
