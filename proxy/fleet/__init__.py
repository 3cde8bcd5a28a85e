"""Fleet mode: the registry sync, the reload channel and shared rate-limit counts (which the
workers of one gateway also share through their limit relay); nothing here is on the request
path. The redis client and its outage state are sandgate.proxy.redis.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "channel",
    "limits_sync",
    "registry_sync",
]
