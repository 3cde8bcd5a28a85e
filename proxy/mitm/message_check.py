"""mitmproxy's type check of every HTTP message's fields, from a table built once per class.

mitmproxy 12.3 checks the type of each field of every `RequestData` and `ResponseData` it
builds (`MessageData.__post_init__`, unless Python runs with -O): a `dataclasses.fields()`
walk and `typecheck.check_option_type` per field, which calls `typing.get_origin` and
rebuilds its error message each time, about 4 % of the gateway's CPU on small requests.
`install()` keeps the check and its errors but reads, per class, a table of field names and
the classes each may hold, built on first use. A field whose type the table cannot express
(anything but a class or a union of classes) is still checked by mitmproxy's function.
"""

from __future__ import annotations

import types
import typing
from dataclasses import fields
from typing import Any

from mitmproxy import http
from mitmproxy.utils import typecheck

__all__ = ["install"]

# (field name, classes the value may be an instance of, or None: use mitmproxy's check, type)
_Check = tuple[str, tuple[type, ...] | None, Any]
_TABLES: dict[type, tuple[_Check, ...]] = {}
_installed = False


def _classes(typeinfo: Any) -> tuple[type, ...] | None:
    """The classes an instance check needs for `typeinfo`, as check_option_type reads it."""
    origin = typing.get_origin(typeinfo)
    if origin is typing.Union or origin is types.UnionType:
        out: list[type] = []
        for arg in typing.get_args(typeinfo):
            one = _classes(arg)
            if one is None:
                return None
            out += one
        return tuple(out)
    if origin is None and isinstance(typeinfo, type) and typeinfo is not typing.Any:
        # check_option_type lets an int stand for a float.
        return (float, int) if typeinfo is float else (typeinfo,)
    return None


def _table(cls: type) -> tuple[_Check, ...]:
    table = _TABLES.get(cls)
    if table is None:
        table = _TABLES[cls] = tuple((f.name, _classes(f.type), f.type) for f in fields(cls))
    return table


def _post_init(self: http.MessageData) -> None:
    for name, classes, typeinfo in _table(type(self)):
        value = getattr(self, name)
        if classes is None:
            typecheck.check_option_type(name, value, typeinfo)
        elif not isinstance(value, classes):
            raise TypeError(f"Expected {typeinfo} for {name}, but got {type(value)}.")


def install() -> None:
    """Check message fields through the per-class tables (idempotent; nothing under -O)."""
    global _installed
    if _installed or not hasattr(http.MessageData, "__post_init__"):
        return
    _installed = True
    http.MessageData.__post_init__ = _post_init  # type: ignore[method-assign]
