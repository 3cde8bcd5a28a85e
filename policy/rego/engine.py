"""Building a Rego engine: `make_engine` picks `embedded` (regopy, in process, per-tenant
bundles; the default) or `opa` (an OPA server's Data API) and puts the decision cache in front.

The protocol, query and verdict live in `protocol`: the engines import it, and a module that
only needs those names does not load the OPA client by importing this one.
"""

from __future__ import annotations

from sandgate.policy.rego.cache import CachingEngine, DecisionCache
from sandgate.policy.rego.embedded import EmbeddedEngine
from sandgate.policy.rego.opa import OpaEngine
from sandgate.policy.rego.protocol import EngineError, PolicyEngine

__all__ = ["make_engine"]


def make_engine(
    kind: str = "embedded",
    *,
    url: str | None = None,
    timeout: float = 0.5,
    token: str | None = None,
    cache_size: int = 10_000,
    cache_ttl: float | None = None,
    max_loaded_bundles: int = 1_000,
) -> PolicyEngine:
    """An engine from plain settings, behind a decision cache (`cache_size=0`: none).

    `kind`: "embedded" (default) or "opa" (needs `url`, e.g. http://127.0.0.1:8181).
    `timeout`: seconds per OPA call. `token`: bearer token for the OPA server.
    `cache_ttl`: seconds a cached decision lives (default: forever for embedded, which
    is exact per policy version; 1 s for opa, whose server may change under us).
    `max_loaded_bundles`: tenants' bundles the embedded engine keeps loaded (~150 KB each).
    """
    engine: PolicyEngine
    if kind == "embedded":
        engine = EmbeddedEngine(max_loaded=max_loaded_bundles)
    elif kind == "opa":
        if not url:
            raise EngineError("the opa engine needs the server's url")
        engine = OpaEngine(url, timeout=timeout, token=token)
        cache_ttl = 1.0 if cache_ttl is None else cache_ttl
    else:
        raise EngineError(f"unknown policy engine {kind!r} (expected 'embedded' or 'opa')")
    if cache_size <= 0:
        return engine
    return CachingEngine(engine, DecisionCache(cache_size, ttl=cache_ttl))
