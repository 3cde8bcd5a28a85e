"""The fleet's sandbox registry in redis: a SandboxStore every gateway sharing the redis reads.

Entries live in one hash (`<prefix>sandboxes`, sandbox id → the entry's JSON); every write
bumps `<prefix>version` and publishes on `<prefix>events` in the same transaction, so each
gateway reloads within a moment (proxy/fleet/registry_sync.py). Writes are check-and-set under WATCH:
two hosts registering at once cannot both take one id or address.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis
import structlog
from pydantic import ValidationError
from redis.exceptions import RedisError, WatchError

from sandgate.policy.errors import PolicyLoadError
from sandgate.policy.model.loader import load_policy_dir
from sandgate.proxy.fleet.channel import FleetKeys, bump_and_publish, event_message
from sandgate.proxy.stores.protocols import StoreError
from sandgate.proxy.stores.registry import DynamicSandbox, already_registered, merge_registry

__all__ = ["RedisSandboxStore", "RegistrySnapshot", "rules_checker"]

log = structlog.get_logger("sandgate.registry")

_CAS_ATTEMPTS = 20

# Remove, and bump + publish only when something was removed, atomically.
_REMOVE_SCRIPT = """
local n = redis.call('HDEL', KEYS[1], ARGV[1])
if n == 1 then
  redis.call('INCR', KEYS[2])
  redis.call('PUBLISH', KEYS[3], ARGV[2])
end
return n
"""

Checker = Callable[[DynamicSandbox], None]


@dataclass(frozen=True, slots=True)
class RegistrySnapshot:
    """The registry at one fleet version; `invalid` names entries that did not parse."""

    version: int
    sandboxes: tuple[DynamicSandbox, ...]
    invalid: tuple[str, ...] = ()


def rules_checker(rules_path: Path) -> Checker:
    """A check that refuses what this host's rules would refuse (unknown tenant, a static id/address)."""

    def check(sandbox: DynamicSandbox) -> None:
        try:
            merge_registry(load_policy_dir(rules_path), [sandbox], Path("sandbox"))
        except PolicyLoadError as e:
            raise StoreError(
                str(e), 409 if any(w in str(e) for w in ("already", "belongs", "carries")) else 400
            ) from None

    return check


def _unreachable(e: RedisError) -> StoreError:
    # The type only: a client error message can carry connection details.
    return StoreError(f"the sandbox registry (redis) is unreachable: {type(e).__name__}", 503)


def _decode(raw: dict[bytes, bytes]) -> tuple[dict[str, DynamicSandbox], list[str]]:
    entries: dict[str, DynamicSandbox] = {}
    invalid: list[str] = []
    for key, value in raw.items():
        name = key.decode(errors="replace")
        try:
            sandbox = DynamicSandbox.model_validate_json(value)
        except ValidationError:
            invalid.append(name)
            continue
        if sandbox.id != name:
            invalid.append(name)
            continue
        entries[name] = sandbox
    return entries, sorted(invalid)


class RedisSandboxStore:
    """SandboxStore over redis; `check` (optional) refuses entries this host's rules reject."""

    def __init__(self, client: aioredis.Redis, keys: FleetKeys, *, check: Checker | None = None) -> None:
        self.client = client
        self.keys = keys
        self.check = check

    async def snapshot(self) -> RegistrySnapshot:
        """Every entry and the fleet version, read in one transaction."""
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.get(self.keys.version)
                pipe.hgetall(self.keys.sandboxes)
                raw_version, raw = await pipe.execute()
        except RedisError as e:
            raise _unreachable(e) from None
        entries, invalid = _decode(raw)
        if invalid:
            log.error("registry.invalid_entries", source="redis", ids=invalid)
        ordered = tuple(entries[k] for k in sorted(entries))
        return RegistrySnapshot(int(raw_version or 0), ordered, tuple(invalid))

    async def list(self) -> list[DynamicSandbox]:
        return list((await self.snapshot()).sandboxes)

    async def add(self, sandbox: DynamicSandbox) -> None:
        """Register; idempotent for an identical entry, StoreError(409) for a conflicting one."""

        def choose(existing: DynamicSandbox | None) -> bool:
            if existing is not None and existing != sandbox:
                raise StoreError(already_registered(existing), 409)
            return existing is None

        if await self._write(sandbox, choose) is None:
            log.info("registry.added", sandbox=sandbox.id, tenant=sandbox.tenant, source="redis")

    async def replace(self, sandbox: DynamicSandbox) -> DynamicSandbox | None:
        """Change a registered entry in one transaction; the entry replaced (None: not registered)."""
        previous = await self._write(sandbox, lambda existing: existing not in (None, sandbox))
        if previous is not None and previous != sandbox:
            log.info(
                "registry.replaced",
                sandbox=sandbox.id,
                old_tenant=previous.tenant,
                tenant=sandbox.tenant,
                source="redis",
            )
        return previous

    async def _write(
        self, sandbox: DynamicSandbox, choose: Callable[[DynamicSandbox | None], bool]
    ) -> DynamicSandbox | None:
        """Write `sandbox` in one optimistic transaction when `choose(the entry of its id)` says so
        (it may raise to refuse); returns that entry as it was."""
        if self.check is not None:
            await asyncio.to_thread(self.check, sandbox)
        payload = sandbox.model_dump_json(exclude_none=True)
        try:
            for _ in range(_CAS_ATTEMPTS):
                try:
                    async with self.client.pipeline(transaction=True) as pipe:
                        await pipe.watch(self.keys.sandboxes)
                        raw: dict[bytes, bytes] = await pipe.hgetall(self.keys.sandboxes)  # type: ignore[assignment]
                        current, _invalid = _decode(raw)
                        existing = current.pop(sandbox.id, None)
                        if not choose(existing):
                            return existing
                        _refuse_taken_address(sandbox, current.values())
                        pipe.multi()  # type: ignore[no-untyped-call]
                        pipe.hset(self.keys.sandboxes, sandbox.id, payload)
                        bump_and_publish(pipe, self.keys, "registry")
                        await pipe.execute()
                        return existing
                except WatchError:
                    continue
        except RedisError as e:
            raise _unreachable(e) from None
        raise StoreError("the sandbox registry is busy (too many concurrent writes); try again", 503)

    async def remove(self, sandbox_id: str) -> bool:
        """Unregister; False when it was not registered (then nothing is published)."""
        try:
            removed = await self.client.eval(
                _REMOVE_SCRIPT,
                3,
                self.keys.sandboxes,
                self.keys.version,
                self.keys.events,
                sandbox_id,
                event_message("registry"),
            )
        except RedisError as e:
            raise _unreachable(e) from None
        if removed:
            log.info("registry.removed", sandbox=sandbox_id, source="redis")
        return bool(removed)


def _refuse_taken_address(sandbox: DynamicSandbox, others: Iterable[DynamicSandbox]) -> None:
    for other in others:
        taken = next((a for a in sandbox.addresses if a in other.addresses), None)
        if taken is not None:
            raise StoreError(f"address {taken} belongs to {other.id!r}", 409)
