"""The two stores the admin API, the CLI and fleet mode write to, as protocols.

One machine: sandboxes in `<state_dir>/sandboxes.json`, credentials in a local encrypted
file. A fleet: both in redis. The admin API and `sandgate sandbox|credentials` talk to these
protocols only, so either backend serves them. Every method is async and may raise
StoreError (backend unreachable, conflict, unknown tenant) with a message fit for the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sandgate.proxy.stores.registry import DynamicSandbox

if TYPE_CHECKING:
    # Annotations only: the brokers package costs `sandgate status` ~0.5 s of start-up.
    from sandgate.brokers import Secret

__all__ = ["CredentialInfo", "CredentialStore", "SandboxStore", "StoreError"]


class StoreError(Exception):
    """A store operation failed; `status` is the HTTP status the admin API answers with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class SandboxStore(Protocol):
    """Sandboxes registered at run time (beyond the tenant files' static ones)."""

    async def list(self) -> list[DynamicSandbox]: ...

    async def add(self, sandbox: DynamicSandbox) -> None:
        """Register; idempotent for an identical entry, StoreError(409) for a conflicting one."""

    async def replace(self, sandbox: DynamicSandbox) -> DynamicSandbox | None:
        """Change a registered sandbox in one write; the entry it replaced (None: not registered,
        nothing written). StoreError(409) when its new address or id conflicts with another."""

    async def remove(self, sandbox_id: str) -> bool:
        """Unregister; False when it was not registered."""


@dataclass(frozen=True, slots=True)
class CredentialInfo:
    """What may be shown about a stored credential: never its value."""

    tenant: str
    name: str
    version: int
    updated: str  # RFC 3339, UTC


class CredentialStore(Protocol):
    """Credential values set at run time, encrypted at rest; write-only from the outside."""

    async def list(self, tenant: str | None = None) -> list[CredentialInfo]: ...

    async def put(self, tenant: str, name: str, value: Secret) -> CredentialInfo:
        """Add, or rotate (the version goes up by one)."""

    async def get(self, tenant: str, name: str) -> Secret | None:
        """The value, for the broker only (the admin API never returns it)."""

    async def remove(self, tenant: str, name: str) -> bool: ...
