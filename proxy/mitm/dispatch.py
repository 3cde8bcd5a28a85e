"""Hook dispatch through a table of the addons that implement each hook, not a walk of all of them.

mitmproxy 12.3's `AddonManager.trigger_event` walks the whole addon chain for every event:
per addon a `safecall()` context manager, an `invoke_addon` coroutine, a `_iter_hooks`
generator over a `traverse` generator, a `getattr` and `event.args()` (a `dataclasses.fields`
walk); and every flow hook is followed by an `UpdateHook` that walks the chain again. With
sandgate's ~22 addons that was about a tenth of the gateway's CPU per request, most of it for
addons that have no such hook. `install()` replaces it with a table per hook name of the
(addon, handler) pairs in chain order, built on first use and dropped whenever the chain
changes (`register`, `add`, `remove`, `clear`).

Behaviour is mitmproxy's: handlers run in chain order (children after their parent, as
`traverse` yields them), sync or async; `AddonHalt` stops the event; `OptionsError` is raised;
any other exception is logged as "Addon error" and the next handler runs. A chain in which
some addon has sub-addons (`addons`, which can change without the manager knowing) is
dispatched by mitmproxy's own walk, as before.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

from mitmproxy import addonmanager, exceptions, hooks

__all__ = ["handlers", "hook_args", "install"]

logger = logging.getLogger(addonmanager.__name__)

_Handlers = tuple[tuple[Any, Callable[..., Any]], ...]
_Table = dict[str, _Handlers]
# manager → hook name → handlers; dropped when the manager's chain changes
_TABLES: weakref.WeakKeyDictionary[addonmanager.AddonManager, _Table] = weakref.WeakKeyDictionary()
_original_trigger_event: Callable[..., Any] | None = None
# hook class → its field names: `Hook.args()` walks `dataclasses.fields` on every event
_ARG_NAMES: dict[type[hooks.Hook], tuple[str, ...]] = {}


def hook_args(event: hooks.Hook) -> list[Any]:
    """`event.args()`: its fields' values in declaration order, from a per-class table."""
    names = _ARG_NAMES.get(type(event))
    if names is None:
        names = _ARG_NAMES[type(event)] = tuple(f.name for f in dataclasses.fields(event))  # type: ignore[arg-type]
    return [getattr(event, name) for name in names]


def handlers(manager: addonmanager.AddonManager, name: str) -> _Handlers | None:
    """The (addon, handler) pairs for hook `name` in dispatch order; None: not cacheable."""
    table = _TABLES.get(manager)
    if table is None:
        if any(hasattr(a, "addons") for a in manager.chain):
            return None
        table = _TABLES[manager] = {}
    found = table.get(name)
    if found is None:
        pairs = []
        for a in addonmanager.traverse(manager.chain):
            func = getattr(a, name, None)
            if not func or isinstance(func, types.ModuleType):
                continue  # mitmproxy skips module imports that share a hook's name, too
            if not callable(func):
                raise exceptions.AddonManagerError(f"Addon handler {name} ({a}) not callable")
            pairs.append((a, func))
        found = table[name] = tuple(pairs)
    return found


async def _trigger_event(self: addonmanager.AddonManager, event: hooks.Hook) -> None:
    """mitmproxy's `trigger_event`, through the table of the hook's handlers."""
    found = handlers(self, event.name)
    if found is None:
        assert _original_trigger_event is not None
        await _original_trigger_event(self, event)
        return
    if not found:
        return
    # A hook class that overrides args() keeps it; mitmproxy's own is the dataclass walk.
    args = hook_args(event) if type(event).args is hooks.Hook.args else event.args()
    for _, func in found:
        try:
            res = func(*args)
            if res is not None and inspect.isawaitable(res):
                await res
        except exceptions.AddonHalt:
            return
        except exceptions.OptionsError:
            raise
        except Exception:
            _log_addon_error()


def _log_addon_error() -> None:
    """What mitmproxy's `safecall` logs for a handler that raised."""
    etype, value, tb = sys.exc_info()
    assert etype is not None and value is not None
    tb = addonmanager.cut_traceback(tb, "_trigger_event")
    logger.error(f"Addon error: {value}", exc_info=(etype, value, tb))


def _forget(self: addonmanager.AddonManager) -> None:
    _TABLES.pop(self, None)


def install() -> None:
    """Dispatch hooks through the per-hook tables, once per process (idempotent)."""
    global _original_trigger_event
    if _original_trigger_event is not None:
        return
    cls = addonmanager.AddonManager
    _original_trigger_event = cls.trigger_event

    def changing(method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: addonmanager.AddonManager, *args: Any, **kwargs: Any) -> Any:
            _forget(self)
            try:
                return method(self, *args, **kwargs)
            finally:
                _forget(self)

        wrapper.__name__ = method.__name__
        wrapper.__doc__ = method.__doc__
        return wrapper

    for name in ("register", "add", "remove", "clear"):
        setattr(cls, name, changing(getattr(cls, name)))
    cls.trigger_event = _trigger_event  # type: ignore[method-assign]
