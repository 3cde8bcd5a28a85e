"""The single-machine SandboxStore: `<state_dir>/sandboxes.json` via register/unregister.

Blocking file and nftables work runs in a worker thread. The gateway reloads after a change
(the admin API asks for it), so the new registry is in force when the call returns.
"""

from __future__ import annotations

import asyncio
import builtins

from sandgate.policy.errors import PolicyLoadError, SandgateError
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.sandboxes.registration import SandboxExists, register, registered, unregister
from sandgate.proxy.stores.protocols import StoreError
from sandgate.proxy.stores.registry import DynamicSandbox

__all__ = ["FileSandboxStore"]


class FileSandboxStore:
    """Sandboxes in the local registry file; host rules installed for those with an interface."""

    def __init__(self, config: GatewayConfig, *, apply_rules: bool = True) -> None:
        self.config = config
        self.apply_rules = apply_rules

    async def list(self) -> builtins.list[DynamicSandbox]:
        return await asyncio.to_thread(self._list)

    async def add(self, sandbox: DynamicSandbox) -> None:
        await asyncio.to_thread(self._add, sandbox)

    async def replace(self, sandbox: DynamicSandbox) -> DynamicSandbox | None:
        return await asyncio.to_thread(self._replace, sandbox)

    async def remove(self, sandbox_id: str) -> bool:
        return await asyncio.to_thread(self._remove, sandbox_id)

    def _list(self) -> builtins.list[DynamicSandbox]:
        try:
            return registered(self.config)
        except PolicyLoadError as e:
            raise StoreError(str(e), 500) from None

    def _add(self, sandbox: DynamicSandbox) -> None:
        # register() refuses a taken id (SandboxExists: 409) and does nothing for an identical one.
        self._register(sandbox, replace=False)

    def _replace(self, sandbox: DynamicSandbox) -> DynamicSandbox | None:
        if not any(s.id == sandbox.id for s in self._list()):
            return None
        return self._register(sandbox, replace=True)

    def _register(self, sandbox: DynamicSandbox, *, replace: bool) -> DynamicSandbox | None:
        try:
            return register(self.config, sandbox, apply_rules=self.apply_rules, replace=replace)
        except SandboxExists as e:
            raise StoreError(str(e), 409) from None
        except PolicyLoadError as e:
            # A taken address, or an id a tenant file already declares.
            raise StoreError(str(e), 409) from None
        except (SandgateError, RuntimeError) as e:
            # No transparent/dns listener for host rules, or nft refused.
            raise StoreError(f"cannot install host rules: {e}", 409) from None

    def _remove(self, sandbox_id: str) -> bool:
        entry = next((s for s in self._list() if s.id == sandbox_id), None)
        if entry is None:
            return False
        # Host rules change only when the entry had an interface: leave the nft table alone otherwise.
        rules = self.apply_rules and entry.interface is not None
        try:
            return unregister(self.config, sandbox_id, apply_rules=rules) is not None
        except (SandgateError, RuntimeError) as e:
            raise StoreError(f"cannot remove host rules: {e}", 500) from None
