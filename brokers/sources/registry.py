"""The `SecretSource` protocol and the registry that maps a reference's scheme to a source."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from sandgate.brokers.secret import Secret
from sandgate.brokers.sources.command import CommandSource
from sandgate.brokers.sources.env import EnvSource
from sandgate.brokers.sources.file import FileSource
from sandgate.policy.errors import SecretReferenceError
from sandgate.policy.model.secret_refs import SecretRef, parse_ref

__all__ = ["SecretRegistry", "SecretSource", "default_registry"]


@runtime_checkable
class SecretSource(Protocol):
    """Where secrets of one scheme come from. `get` raises SecretUnavailable, never returns a blank."""

    async def get(self, ref: SecretRef) -> Secret:
        """The current value of `ref`; blocking work happens off the event loop."""
        ...


class SecretRegistry:
    """Scheme → source. `await registry.get("env:NAME")` resolves a reference."""

    __slots__ = ("_sources",)

    def __init__(self, sources: Mapping[str, SecretSource]) -> None:
        self._sources = dict(sources)

    def with_source(self, scheme: str, source: SecretSource) -> SecretRegistry:
        """A copy with one more (or a replaced) scheme, e.g. `redis` in fleet mode."""
        return SecretRegistry({**self._sources, scheme: source})

    def supports(self, ref: SecretRef | str) -> bool:
        """Whether a source is registered for the reference's scheme."""
        parsed = parse_ref(ref) if isinstance(ref, str) else ref
        return parsed.scheme in self._sources

    @property
    def schemes(self) -> frozenset[str]:
        return frozenset(self._sources)

    async def get(self, ref: SecretRef | str) -> Secret:
        """Resolve a reference through the source registered for its scheme."""
        parsed = parse_ref(ref) if isinstance(ref, str) else ref
        source = self._sources.get(parsed.scheme)
        if source is None:
            raise SecretReferenceError(f"no secret source handles '{parsed.scheme}:' references")
        return await source.get(parsed)


def default_registry(*, command_ttl: float = 60.0, command_timeout: float = 10.0) -> SecretRegistry:
    """`env:`, `file:` and `cmd:` sources with their defaults."""
    return SecretRegistry(
        {
            "env": EnvSource(),
            "file": FileSource(),
            "cmd": CommandSource(ttl=command_ttl, timeout=command_timeout),
        }
    )
