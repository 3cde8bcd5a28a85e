"""Name bindings: which addresses the gateway gave a sandbox for which names, and until when.

In transparent mode a guest connects to an IP and claims a name (SNI, Host). The claim is
honoured only if the gateway itself resolved that name to that IP for that sandbox, through
its DNS listener (remembered here with the answer's TTL) or its own resolver.
"""

from __future__ import annotations

import time
from collections import OrderedDict

__all__ = ["NameBindings"]


class NameBindings:
    """A bounded map (sandbox, address) → {name: expiry}, refreshed by DNS answers."""

    def __init__(self, *, max_entries: int = 200_000, min_ttl: float = 30.0, max_ttl: float = 3600.0) -> None:
        self._entries: OrderedDict[tuple[str, str], dict[str, float]] = OrderedDict()
        self._max_entries = max_entries
        self._min_ttl = min_ttl
        self._max_ttl = max_ttl

    def remember(self, sandbox: str, name: str, addresses: tuple[str, ...], ttl: float) -> None:
        """Record that `sandbox` was told `name` is at `addresses`.

        Kept at least `min_ttl`: a client may connect a little after the answer's TTL ran out.
        """
        expiry = time.monotonic() + min(max(ttl, self._min_ttl), self._max_ttl)
        for address in addresses:
            key = (sandbox, address)
            names = self._entries.get(key)
            if names is None:
                names = self._entries[key] = {}
            names[name] = expiry
            self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def bound(self, sandbox: str, address: str, name: str) -> bool:
        """Whether `sandbox` was given `address` for `name` and the binding has not expired."""
        names = self._entries.get((sandbox, address))
        if not names:
            return False
        expiry = names.get(name)
        if expiry is None:
            return False
        if expiry < time.monotonic():
            del names[name]
            return False
        return True

    def names_for(self, sandbox: str, address: str) -> list[str]:
        """The unexpired names `sandbox` was given `address` for (raw-TCP rules by name)."""
        now = time.monotonic()
        return [n for n, exp in (self._entries.get((sandbox, address)) or {}).items() if exp >= now]
