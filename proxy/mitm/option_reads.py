"""Reading a mitmproxy option without deep-copying a value that cannot change.

mitmproxy 12.3's `_Option.current()` returns `copy.deepcopy` of the value (of a deep copy,
for an option left at its default) on every read, and its layers and sandgate's head caps
read options on every event. A deep copy of a str, int, float, bool, bytes or None is the
value itself, so `install()` returns those as they are and deep-copies everything else
(lists, sequences, dicts) as before: the same values, without two `deepcopy` calls per read.
"""

from __future__ import annotations

import copy
from typing import Any

from mitmproxy import optmanager

__all__ = ["install"]

_ATOMIC = frozenset({str, int, float, bool, bytes, type(None)})
_installed = False


def _current(self: optmanager._Option) -> Any:
    value = self._default if self.value is optmanager.unset else self.value
    return value if type(value) in _ATOMIC else copy.deepcopy(value)


def install() -> None:
    """Read options through `_current` (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    optmanager._Option.current = _current  # type: ignore[method-assign]
