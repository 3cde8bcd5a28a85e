"""Opening the configured credential store (file or redis) and the secret sources reading it."""

from __future__ import annotations

from sandgate.brokers import SecretRegistry, default_registry
from sandgate.brokers.sources.stored import StoredSource
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.redis.client import Keys, connect
from sandgate.proxy.stores.credentials import RekeyableStore
from sandgate.proxy.stores.credentials_file import FileCredentialStore
from sandgate.proxy.stores.credentials_redis import RedisCredentialStore
from sandgate.proxy.stores.sealing_keys import StoreKeys

__all__ = ["open_credential_store", "stored_secrets"]


def open_credential_store(config: GatewayConfig) -> RekeyableStore:
    """The configured store: redis when `redis:` is set, else `<state_dir>/credentials.sealed.json`.

    A local store creates its key file on first use; a fleet's must exist (all gateways share it).
    """
    keys = StoreKeys(config.store_keys_ref, create=config.redis is None)
    if config.redis is not None:
        return RedisCredentialStore(connect(config.redis), Keys(config.redis.prefix), keys)
    return FileCredentialStore(config.credentials_store_path, keys)


def stored_secrets(config: GatewayConfig) -> tuple[RekeyableStore, StoredSource, SecretRegistry]:
    """The configured store, the `stored:` source reading it, and the default registry plus `stored:`."""
    store = open_credential_store(config)
    source = StoredSource(store, ttl=config.credentials.stored_cache_seconds)
    return store, source, default_registry().with_source("stored", source)
