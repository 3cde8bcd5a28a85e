"""Stored credentials for a fleet: one redis hash `<prefix>credentials`, field `<tenant>/<name>`.

Values are sealed here, before they leave the process; redis only ever holds the record
(key id, nonce, ciphertext, version, updated). Every change publishes `credentials` on
`<prefix>events` so each gateway drops its cached values. Version bumps and re-seals are
Lua scripts, so concurrent writers neither lose a version nor overwrite a newer value.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from sandgate.brokers import Secret
from sandgate.brokers.sealing import Keyring
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.redis.client import Keys
from sandgate.proxy.stores.credentials import StoredRecord, check_names, entry_key, split_entry_key, utc_now
from sandgate.proxy.stores.protocols import CredentialInfo, StoreError
from sandgate.proxy.stores.sealing_keys import StoreKeys

__all__ = ["CHANGE_MESSAGE", "RedisCredentialStore"]

CHANGE_MESSAGE = b"credentials"

# KEYS: hash, channel. ARGV: field, record JSON (version filled in here), must_exist, message.
_PUT = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old and ARGV[3] == '1' then return 0 end
local version = 1
if old then version = tonumber(cjson.decode(old)['version']) + 1 end
local rec = cjson.decode(ARGV[2])
rec['version'] = version
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(rec))
redis.call('PUBLISH', KEYS[2], ARGV[4])
return version
"""

# KEYS: hash, channel. ARGV: field, message.
_REMOVE = """
local n = redis.call('HDEL', KEYS[1], ARGV[1])
if n == 1 then redis.call('PUBLISH', KEYS[2], ARGV[2]) end
return n
"""

# KEYS: hash. ARGV: field, expected record, new record. Replaces only an unchanged record.
_SWAP = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  return 1
end
return 0
"""


class RedisCredentialStore:
    """A `CredentialStore` in redis; a redis fault is StoreError(503), never a silent empty answer."""

    def __init__(self, client: aioredis.Redis, keys: Keys, store_keys: StoreKeys) -> None:
        self.client = client
        self.hash = keys("credentials")
        self.channel = keys("events")
        self._keys = store_keys
        self._put = client.register_script(_PUT)
        self._remove = client.register_script(_REMOVE)
        self._swap = client.register_script(_SWAP)

    async def list(self, tenant: str | None = None) -> list[CredentialInfo]:
        raw = await self._call(self.client.hgetall(self.hash))
        infos = []
        for field, value in raw.items():
            t, name = split_entry_key(field.decode())
            if tenant is None or t == tenant:
                infos.append(StoredRecord.from_json(value, f"redis {self.hash} {t}/{name}").info(t, name))
        return sorted(infos, key=lambda i: (i.tenant, i.name))

    async def put(self, tenant: str, name: str, value: Secret, *, must_exist: bool = False) -> CredentialInfo:
        """Add or replace (version + 1); with `must_exist`, StoreError(404) when it is not set."""
        check_names(tenant, name)
        if not value:
            raise StoreError("a credential value may not be empty")
        keyring = await self._keyring()
        updated = utc_now()
        record = StoredRecord.seal(keyring, tenant, name, value, version=1, updated=updated)
        version = await self._call(
            self._put(
                keys=[self.hash, self.channel],
                args=[entry_key(tenant, name), record.to_json(), "1" if must_exist else "0", CHANGE_MESSAGE],
            )
        )
        if int(version) == 0:
            raise StoreError(f"credential {name} of tenant {tenant} is not set", 404)
        return CredentialInfo(tenant=tenant, name=name, version=int(version), updated=updated)

    async def get(self, tenant: str, name: str) -> Secret | None:
        raw = await self._call(self.client.hget(self.hash, entry_key(tenant, name)))
        if raw is None:
            return None
        record = StoredRecord.from_json(raw, f"redis {self.hash} {tenant}/{name}")
        return record.open(await self._keyring(), tenant, name)

    async def remove(self, tenant: str, name: str) -> bool:
        removed = await self._call(
            self._remove(keys=[self.hash, self.channel], args=[entry_key(tenant, name), CHANGE_MESSAGE])
        )
        return int(removed) == 1

    async def rekey(self) -> int:
        """Re-seal every value not sealed with the newest key; a value changed meanwhile is left as is."""
        keyring = await self._keyring()
        raw = await self._call(self.client.hgetall(self.hash))
        count = 0
        for field, value in raw.items():
            tenant, name = split_entry_key(field.decode())
            record = StoredRecord.from_json(value, f"redis {self.hash} {tenant}/{name}")
            if record.sealed.key_id == keyring.newest:
                continue
            resealed = StoredRecord.seal(
                keyring,
                tenant,
                name,
                record.open(keyring, tenant, name),
                version=record.version,
                updated=record.updated,
            )
            # A concurrent put already sealed it with the newest key: nothing to do then.
            count += int(
                await self._call(self._swap(keys=[self.hash], args=[field, value, resealed.to_json()]))
            )
        return count

    async def aclose(self) -> None:
        await self.client.aclose()

    async def _keyring(self) -> Keyring:
        try:
            return await asyncio.to_thread(self._keys.keyring)
        except ConfigError as e:
            raise StoreError(str(e), 500) from None

    @staticmethod
    async def _call(awaitable: Awaitable[Any] | Any) -> Any:
        try:
            return await awaitable
        except RedisError as e:
            raise StoreError(f"redis is unreachable or failed: {type(e).__name__}", 503) from None
