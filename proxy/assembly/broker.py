"""The credential broker's builder: the broker, the credential store its `stored:` secrets
come from, and the two tasks that keep what it knows current."""

from __future__ import annotations

from dataclasses import dataclass

from sandgate.brokers import Broker
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.refresh.secret_refresh import SecretRefresher
from sandgate.proxy.stores.credentials import RekeyableStore
from sandgate.proxy.stores.credentials_factory import stored_secrets
from sandgate.proxy.stores.credentials_watch import CredentialWatcher
from sandgate.proxy.stores.placeholder_key import load_placeholder_key

__all__ = ["CredentialParts", "build_broker"]


@dataclass(frozen=True)
class CredentialParts:
    """The broker and what feeds it."""

    broker: Broker
    # The admin API's credential store (file, or redis in a fleet).
    store: RekeyableStore
    # Invalidates the cached `stored:` secrets when the store changes.
    watch: CredentialWatcher
    # Tells the scrubbers every injectable secret before the first request, and as it changes.
    refresh: SecretRefresher


def build_broker(config: GatewayConfig) -> CredentialParts:
    """The broker with the default secret sources plus `stored:` (read through a cache)."""
    store, stored, secrets = stored_secrets(config)
    watch = CredentialWatcher(store, stored, interval=config.reload.interval_seconds)
    broker = Broker(placeholder_key=load_placeholder_key(config.placeholder_key_ref), secrets=secrets)
    refresh = SecretRefresher(broker, interval=config.reload.interval_seconds)

    def changed() -> None:
        broker.secrets_changed()
        refresh.poke()

    stored.on_change = changed
    return CredentialParts(broker, store, watch, refresh)
