"""The one-machine SandboxStore: `<state_dir>/sandboxes.json`, through proxy/sandboxes.py.

The same protocol as the redis store, so the admin API serves either. Host rules are not
touched here (`sandgate sandbox add` and jail install them); the running gateway picks the
file up on its next reload (it watches the file).
"""

from __future__ import annotations

import asyncio

from sandgate.policy.errors import PolicyLoadError

from .config import GatewayConfig
from .registry import DynamicSandbox
from .sandboxes import register, registered, unregister
from .stores import StoreError

__all__ = ["FileSandboxStore"]


class FileSandboxStore:
    """SandboxStore over sandboxes.json (file I/O runs in a worker thread)."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config

    async def list(self) -> list[DynamicSandbox]:
        try:
            return await asyncio.to_thread(registered, self.config)
        except PolicyLoadError as e:
            raise StoreError(str(e), 500) from None

    async def add(self, sandbox: DynamicSandbox) -> None:
        """Register; idempotent for an identical entry, StoreError(409) for a conflicting one."""
        existing = next((s for s in await self.list() if s.id == sandbox.id), None)
        if existing == sandbox:
            return
        if existing is not None:
            raise StoreError(f"sandbox {sandbox.id!r} is already registered differently", 409)
        try:
            await asyncio.to_thread(register, self.config, sandbox, apply_rules=False)
        except PolicyLoadError as e:
            text = str(e)
            raise StoreError(text, 409 if "already" in text or "belongs" in text else 400) from None

    async def remove(self, sandbox_id: str) -> bool:
        """Unregister; False when it was not registered."""
        removed = await asyncio.to_thread(unregister, self.config, sandbox_id, apply_rules=False)
        return removed is not None
