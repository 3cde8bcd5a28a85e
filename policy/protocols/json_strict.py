"""A strict, bounded JSON reader for bodies a security decision is made on. No I/O.

Two JSON parsers can read the same bytes differently: with `"name"` twice, one keeps the
first value and another the last; `NaN`, a BOM, comments or a second value after the first
are accepted by some and refused by others. The gateway decides on one reading and the
upstream acts on its own, so anything readers disagree on is refused here:

- more than `max_bytes` bytes (before any parsing);
- not UTF-8, or a UTF-8 byte order mark;
- nesting deeper than `max_depth`, found by a pre-scan of the bytes (brackets counted
  outside strings) so a deep document is refused before the parser recurses;
- anything `json.loads` refuses (comments, trailing data, single quotes ...);
- a key twice in one object, anywhere;
- `NaN`, `Infinity`, `-Infinity`, and numbers too large for a float (`1e400`);
- a `\\uD800`-style escape with no partner surrogate (not encodable as UTF-8).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, NoReturn

from sandgate.policy.protocols.errors import JsonError, Problem

__all__ = ["DEFAULT_LIMITS", "JsonLimits", "JsonValue", "loads_strict", "nesting_depth"]

type JsonValue = bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None

# Far below Python's recursion limit (1000), which json.loads would otherwise meet first.
_DEPTH_CEILING = 256
_BOM = b"\xef\xbb\xbf"
# A JSON string literal (unrolled, so linear): skipped by the depth pre-scan.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
# A surrogate escape; only then is the parsed value walked for unpaired ones.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass(frozen=True, slots=True)
class JsonLimits:
    """How much JSON the reader takes: bytes of the body, levels of nesting."""

    max_bytes: int = 1 << 20
    max_depth: int = 64

    def __post_init__(self) -> None:
        if self.max_bytes < 2:
            raise ValueError("max_bytes must be at least 2")
        if not 1 <= self.max_depth <= _DEPTH_CEILING:
            raise ValueError(f"max_depth must be between 1 and {_DEPTH_CEILING}")


DEFAULT_LIMITS = JsonLimits()


def loads_strict(data: bytes | str, limits: JsonLimits = DEFAULT_LIMITS) -> JsonValue:
    """The one reading of a JSON body, or JsonError naming why there is none."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if len(raw) > limits.max_bytes:
        _fail(Problem.TOO_LARGE, f"{len(raw)} bytes, the limit is {limits.max_bytes}")
    if raw.startswith(_BOM):
        _fail(Problem.BOM, "a UTF-8 byte order mark before the JSON")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        _fail(Problem.INVALID_UTF8, f"not UTF-8 at byte {e.start}")
    depth = _bracket_count(raw, limits.max_depth) or nesting_depth(raw)
    if depth > limits.max_depth:
        _fail(Problem.TOO_DEEP, f"nested {depth} levels, the limit is {limits.max_depth}")
    value = _parse(text)
    if _SURROGATE_ESCAPE.search(raw) and _has_unpaired_surrogate(value):
        _fail(Problem.UNPAIRED_SURROGATE, "a \\u escape of half a surrogate pair")
    return value


def nesting_depth(raw: bytes) -> int:
    """The deepest bracket nesting of a JSON text, brackets inside strings left out."""
    skeleton = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(_STEP[b] for b in skeleton), default=0)


def _bracket_count(raw: bytes, max_depth: int) -> int:
    """A cheap upper bound on the depth when it is within max_depth (few brackets), else 0."""
    count = len(raw.translate(None, _NOT_BRACKETS))
    return count if count <= max_depth else 0


def _parse(text: str) -> JsonValue:
    """json.loads with duplicate keys and non-finite numbers refused."""
    try:
        value: JsonValue = json.loads(
            text, object_pairs_hook=_unique_object, parse_constant=_no_constant, parse_float=_finite_float
        )
    except JsonError:
        raise
    except RecursionError:
        _fail(Problem.TOO_DEEP, "nested too deep to parse")
    except ValueError as e:
        # JSONDecodeError and int conversion limits; the message names no body content.
        _fail(Problem.NOT_JSON, str(e).split(":")[0])
    return value


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object from its members, refusing a key given twice."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                _fail(Problem.DUPLICATE_KEY, f"key {_echo(key)} given twice in one object")
            seen.add(key)
    return out


def _no_constant(name: str) -> NoReturn:
    """Refuse NaN, Infinity and -Infinity."""
    _fail(Problem.NOT_FINITE, f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    """A float literal, refusing one too large to be finite (`1e400`)."""
    value = float(text)
    if not math.isfinite(value):
        _fail(Problem.NOT_FINITE, f"{text[:40]} does not fit a finite number")
    return value


def _has_unpaired_surrogate(value: JsonValue) -> bool:
    """Whether any key or string in a parsed value holds half a surrogate pair."""
    stack: list[JsonValue] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            strings: list[str] = [item]
        elif isinstance(item, dict):
            strings = list(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            strings = []
            stack.extend(item)
        else:
            continue
        if any(not s.isascii() and not _encodable(s) for s in strings):
            return True
    return False


def _encodable(text: str) -> bool:
    """Whether a string is valid Unicode (encodes as UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _echo(text: str) -> str:
    """Repr of at most 40 characters of a guest-supplied value."""
    return repr(text[:40]) + ("..." if len(text) > 40 else "")


def _fail(code: Problem, message: str) -> NoReturn:
    raise JsonError(code, message)
