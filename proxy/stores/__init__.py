"""Stores written at run time: sealed stored credentials (file or redis), the sandbox
registry (file or redis), the keys they are sealed with, and watching them change.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "credentials",
    "credentials_factory",
    "credentials_file",
    "credentials_redis",
    "credentials_watch",
    "placeholder_key",
    "protocols",
    "registry",
    "registry_change",
    "registry_file",
    "registry_redis",
    "sealing_keys",
]
