"""Faults of the proxy layer. A denial is not an exception; these are.

SandgateError                 (sandgate.policy.errors)
 └── ProxyError
      ├── CAError        the gateway's CA is missing, unreadable, inconsistent or not private
      ├── ConfigError    gateway options or files that cannot be turned into a running proxy
      ├── ListenerError  an address the gateway listens on cannot be bound (port taken, ...)
      └── StateDirInUse  another gateway holds the state folder (proxy/state/state_lock.py)
"""

from __future__ import annotations

from sandgate.policy.errors import SandgateError

__all__ = ["CAError", "ConfigError", "ListenerError", "ProxyError", "SandgateError", "StateDirInUse"]


class ProxyError(SandgateError):
    """A fault in the proxy layer: CA, options, start-up."""


class CAError(ProxyError):
    """The gateway's certificate authority is missing, unreadable, inconsistent or exposed."""


class ConfigError(ProxyError):
    """Gateway configuration that cannot be turned into a running proxy."""


class ListenerError(ProxyError):
    """A listener (proxy, transparent, DNS, admin) cannot be bound; the message is one line."""


class StateDirInUse(ProxyError):
    """Another live gateway holds the state folder's lock; the message is one line naming both."""
