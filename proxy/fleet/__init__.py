"""Fleet mode: one redis client setup, the registry sync, the reload channel and shared
rate-limit counts; nothing here is on the request path.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "channel",
    "limits_sync",
    "local_broker",
    "redis_client",
    "registry_sync",
]
