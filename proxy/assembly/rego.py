"""The Rego engine's builder."""

from __future__ import annotations

from sandgate.policy.rego.compiler import use_store
from sandgate.policy.rego.engine import make_engine
from sandgate.policy.rego.protocol import PolicyEngine
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.stores.placeholder_key import load_placeholder_key

__all__ = ["build_engine"]


def build_engine(config: GatewayConfig) -> PolicyEngine:
    """The Rego engine the config names, behind the decision cache. Compiled bundles go to the
    configured store, set here: before the first policy load compiles any."""
    rego = config.rego
    if rego.bundle_store:
        use_store(config.path(rego.bundle_store))
    token = None
    if rego.opa.token:
        token = load_placeholder_key(rego.opa.token, create=False, min_bytes=1).reveal()
    return make_engine(
        rego.engine,
        url=rego.opa.url if rego.engine == "opa" else None,
        timeout=rego.opa.timeout_seconds,
        token=token,
        cache_size=rego.cache.size,
        cache_ttl=rego.cache.ttl_seconds,
        max_loaded_bundles=rego.max_loaded_bundles,
    )
