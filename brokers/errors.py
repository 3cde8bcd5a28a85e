"""Faults of the credential broker. A denial is not an exception; these are.

SandgateError
 └── BrokerError
      ├── BrokerConfigError        credentials that cannot be put in force (conflict, unknown source)
      │    └── KeyringError        store keys that cannot be read (bad line, short key, duplicate id)
      └── SecretUnavailable        a secret cannot be had right now (missing, unreadable, command failed)
           ├── TokenEndpointError  an OAuth2 or GitHub token endpoint failed or refused
           └── SealingError        a stored value that does not open (unknown key id, tampered, moved)

A secret reference with bad syntax (`env:`, `file:`, `cmd:` ...) is a policy fault,
`sandgate.policy.errors.SecretReferenceError`: tenant files declare references, and
policy checks them; it is re-exported here for the broker's callers.

No message ever contains a secret value, a token, or the output of a secret command.
"""

from __future__ import annotations

from sandgate.policy.errors import SandgateError, SecretReferenceError

__all__ = [
    "BrokerConfigError",
    "BrokerError",
    "KeyringError",
    "SandgateError",
    "SealingError",
    "SecretReferenceError",
    "SecretUnavailable",
    "TokenEndpointError",
]


class BrokerError(SandgateError):
    """A fault in secret handling or credential injection."""


class BrokerConfigError(BrokerError):
    """Credentials that cannot be put in force as written."""


class SecretUnavailable(BrokerError):
    """A secret that cannot be had right now; the request that needs it is denied (fail closed)."""


class TokenEndpointError(SecretUnavailable):
    """A token endpoint (OAuth2, GitHub App) failed, refused, or answered something unusable."""


class KeyringError(BrokerConfigError):
    """Store keys that cannot be put in force: a malformed line, a key of the wrong size, a duplicate id."""


class SealingError(SecretUnavailable):
    """A sealed value that does not open: its key id is not in the ring, or it was altered or moved."""
