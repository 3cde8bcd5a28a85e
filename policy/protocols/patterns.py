"""Regexes and globs of protocol rules: compiled once at load, matched within a time bound.

A rule's pattern runs on guest-controlled text, with the `regex` package (mrab-regex), a
backtracking engine; never google-re2, whose RE2 collides with the one rego-cpp bundles
(`regopy`): the two in one process abort it. So every match of a pattern is bounded:

- a regex is matched with `timeout=MATCH_TIMEOUT`; a match that runs out of time counts
  against the guest (fail closed): an argument predicate fails, an allow list does not
  match, a deny or ask list (and a list of argument keys) does match;
- a regex is refused at load when it would be unbounded or surprising: backreferences,
  lookaround, conditionals, atomic groups and possessive repeats, a repeat over 1000,
  nesting over 100 deep, a `{` that is not a repeat (to `regex` it may be fuzzy matching:
  write `\\{`), and anything Python's `re` does not read as written (`\\p{..}`, POSIX
  classes, nested sets); the pattern is at most MAX_PATTERN characters;
- a glob is translated so that it cannot backtrack beyond O(len(name) * len(glob)): each
  segment between two `*` is found at its leftmost place in an atomic group.

Every pattern matches the whole text (`fullmatch`). Globs: `*` any run of characters (`/`
included), `?` one character, everything else itself.
"""

from __future__ import annotations

import importlib
import re
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, Final, Protocol

import regex  # type: ignore[import-untyped]  # mrab-regex ships no type information

from sandgate.policy.protocols.errors import PatternError

__all__ = [
    "MATCH_TIMEOUT",
    "MAX_DEPTH",
    "MAX_PATTERN",
    "MAX_REPEAT",
    "BoundedPattern",
    "GlobList",
    "compile_globs",
    "compile_regex",
    "is_glob",
]

MAX_PATTERN: Final = 1024
# The bound on one match of one pattern against one text, in seconds. A glob list spends at
# most twice this on one name (its combined pass, then one pass per glob after a timeout).
MATCH_TIMEOUT: Final = 0.010
# The largest count a repeat may name (`a{1000}`), as RE2 allowed.
MAX_REPEAT: Final = 1000
# How deep groups and repeats may nest (the parsers and the compiler recurse).
MAX_DEPTH: Final = 100

# Python's own regex parser reads a user's pattern to check its shape; it has no public API
# (nor type stubs), hence the import by name. `regex` then compiles the same text: for what
# `re` accepts without a warning, and without `{` literals, the two read it alike.
_re_parser: Any = importlib.import_module("re._parser")

_REFUSED: Final = {
    "GROUPREF": "a backreference",
    "GROUPREF_EXISTS": "a conditional on a group",
    "ASSERT": "a lookaround",
    "ASSERT_NOT": "a lookaround",
    "ATOMIC_GROUP": "an atomic group",
    "POSSESSIVE_REPEAT": "a possessive repeat",
}
_REPEATS: Final = {"MAX_REPEAT", "MIN_REPEAT"}
# A `{` that is neither escaped, nor in `\N{name}`, nor a counted repeat: `re` reads it as
# itself, `regex` may read a fuzzy match (`(?:abc){e<=1}`), so it is refused.
_BRACES: Final = re.compile(r"\\N\{[^}]*\}|\\.|\{(?:\d+(?:,\d*)?|,\d+)\}|(\{)", re.DOTALL)
_V0: Final[int] = regex.V0
_GLOB_FLAGS: Final[int] = regex.V0 | regex.DOTALL


class _Compiled(Protocol):
    """The part of a compiled `regex` pattern used here (the package has no type stubs)."""

    def fullmatch(self, text: str, *, timeout: float) -> Any: ...

    def match(self, text: str, *, timeout: float) -> Any: ...


class BoundedPattern:
    """A compiled pattern that matches whole strings within MATCH_TIMEOUT."""

    __slots__ = ("_compiled", "source")

    def __init__(self, source: str, compiled: _Compiled) -> None:
        self.source = source
        self._compiled = compiled

    def check(self, text: str, timeout: float = MATCH_TIMEOUT) -> bool | None:
        """Whether the pattern matches all of `text`; None when the time bound ran out.

        Text that is not valid Unicode (a lone surrogate) never matches.
        """
        if not _valid_unicode(text):
            return False
        return _fullmatch(self._compiled, text, timeout)

    def fullmatch(self, text: str) -> bool:
        """Whether the pattern matches all of `text` in time (a timeout is no match)."""
        return self.check(text) is True

    def __repr__(self) -> str:
        return f"BoundedPattern({self.source!r})"


def compile_regex(pattern: str, *, fold_case: bool = False) -> BoundedPattern:
    """A user's regex compiled for bounded matching, or PatternError saying why it is refused."""
    if len(pattern) > MAX_PATTERN:
        raise PatternError(f"a pattern is at most {MAX_PATTERN} characters")
    why = _shape_problem(pattern)
    if why is not None:
        raise PatternError(f"{pattern[:80]!r} is refused as a regex: {why}")
    return BoundedPattern(pattern, _compile(pattern, _V0 | (regex.IGNORECASE if fold_case else 0)))


def compile_globs(globs: Iterable[str], *, fold_case: bool = False) -> BoundedPattern:
    """One pattern matching any of `globs` (see the module docstring)."""
    globs = list(globs)
    for glob in globs:
        if len(glob) > MAX_PATTERN:
            raise PatternError(f"a glob is at most {MAX_PATTERN} characters")
    # An empty list matches nothing: a class that no character is in.
    source = "|".join(f"(?:{_glob_regex(glob)})" for glob in globs) or "[^\\s\\S]"
    return BoundedPattern(source, _compile(source, _glob_flags(fold_case)))


def is_glob(text: str) -> bool:
    """Whether a glob has a wildcard (else it matches only itself)."""
    return "*" in text or "?" in text


def _glob_regex(glob: str) -> str:
    """A glob as a regex that backtracks at most O(len(text) * len(glob)).

    Between the first and the last segment, each segment is taken at its leftmost place and
    never revisited (an atomic group): segments have a fixed length, so the leftmost place
    leaves the most room to the rest, and giving it up could never help.
    """
    if "*" not in glob:
        return _segment(glob)
    first, *middle, last = (_segment(s) for s in glob.split("*"))
    inner = "".join(f"(?>.*?{s})" for s in middle if s)
    return f"{first}{inner}.*{last}"


def _segment(text: str) -> str:
    """A run of a glob without `*`: `?` one character, everything else itself."""
    return "".join("." if ch == "?" else regex.escape(ch, special_only=False) for ch in text)


def _glob_flags(fold_case: bool) -> int:
    return _GLOB_FLAGS | (regex.IGNORECASE if fold_case else 0)


def _compile(source: str, flags: int) -> _Compiled:
    try:
        compiled: _Compiled = regex.compile(source, flags)
    except regex.error as e:
        raise PatternError(f"{source[:80]!r} is not a regex: {e}") from None
    return compiled


def _fullmatch(compiled: _Compiled, text: str, timeout: float) -> bool | None:
    """Whether `compiled` matches all of `text`; None when `timeout` (seconds) ran out."""
    if timeout <= 0:
        return None
    try:
        return compiled.fullmatch(text, timeout=timeout) is not None
    except TimeoutError:
        return None


def _valid_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _require_unicode(text: str) -> None:
    """Raise UnicodeEncodeError for text that is not valid Unicode (a lone surrogate)."""
    if not text.isascii():
        text.encode("utf-8")


def _shape_problem(pattern: str) -> str | None:
    """Why a user's regex is refused (see the module docstring), or None."""
    try:
        with warnings.catch_warnings():
            # `re` warns of what it reads otherwise than `regex` (nested sets, POSIX classes).
            warnings.simplefilter("error")
            parsed = _re_parser.parse(pattern)
    except (re.error, OverflowError, RecursionError, Warning) as e:
        return str(e) or type(e).__name__
    if any(m.group(1) for m in _BRACES.finditer(pattern)):
        return "a `{` that starts no repeat `{m,n}` (write a literal one as `\\{`)"
    for name, av, depth in _nodes(parsed):
        if depth > MAX_DEPTH:
            return f"a pattern nests at most {MAX_DEPTH} deep"
        if name in _REFUSED:
            return f"{_REFUSED[name]} is not allowed (matching must stay bounded)"
        if name in _REPEATS and max(av[0], -1 if av[1] == _re_parser.MAXREPEAT else av[1]) > MAX_REPEAT:
            return f"a repeat is at most {{{MAX_REPEAT}}}"
    return None


def _nodes(parsed: Any) -> Iterator[tuple[str, Any, int]]:
    """Every (opcode name, argument, depth) of a parsed pattern, outside character sets."""
    stack = [(parsed, 0)]
    while stack:
        subpattern, depth = stack.pop()
        for op, av in subpattern:
            yield str(op), av, depth
            if str(op) != "IN":
                stack.extend((child, depth + 1) for child in _children(av))


def _children(av: Any) -> Iterator[Any]:
    """The parsed subpatterns inside one node's argument (nested a few tuples deep at most)."""
    if isinstance(av, _re_parser.SubPattern):
        yield av
    elif isinstance(av, tuple | list):
        for item in av:
            yield from _children(item)


class GlobList:
    """Globs of one rule list, matched one name at a time, answering which entry matched.

    Names without a wildcard are looked up in a dict; the globs are one pattern, so a list
    of a hundred globs costs one call into the engine. With `fold_case`, letters match
    in either case (deny and ask lists: a restriction must cover every spelling a lenient
    server might accept). With `timeout_matches`, a glob that runs out of time matches
    (deny and ask lists, argument keys: a restriction applies); else it does not (allow
    lists: a timeout never allows). Text that is not valid Unicode raises
    UnicodeEncodeError (the JSON reader never lets it through; a fault denies).
    """

    __slots__ = ("_all", "_any", "_each", "_exact", "_fold", "_timeout", "_timeout_matches", "entries")

    def __init__(
        self,
        entries: Iterable[str],
        *,
        fold_case: bool = False,
        timeout_matches: bool = False,
        timeout: float | None = None,
    ) -> None:
        self.entries = tuple(entries)
        self._fold = fold_case
        self._timeout_matches = timeout_matches
        # seconds for one name (MATCH_TIMEOUT when None, read when the list is built)
        self._timeout = max(0.0, MATCH_TIMEOUT if timeout is None else timeout)
        self._exact: dict[str, list[int]] = {}
        globs: list[int] = []
        for index, entry in enumerate(self.entries):
            if is_glob(entry):
                globs.append(index)
            else:
                self._exact.setdefault(self._key(entry), []).append(index)
        flags = _glob_flags(fold_case)
        sources = [_glob_regex(self.entries[i]) for i in globs]
        # Group N+1 of `_any` and of `_all` is the glob N of `_each`. `_any`: the first glob
        # that matches; `_all`: every glob, each tried in a lookahead that may fail.
        self._each = [(i, _compile(source, flags)) for i, source in zip(globs, sources, strict=True)]
        self._any = _compile("|".join(f"({s})" for s in sources), flags) if globs else None
        self._all = _compile("".join(f"(?:(?=({s})\\Z)|)" for s in sources), flags) if globs else None

    def match(self, name: str) -> int | None:
        """The index of the first entry that matches `name`, or None."""
        _require_unicode(name)
        exact = self._exact.get(self._key(name), [None])[0]
        first = self._first_glob(name)
        if first is None or exact is None:
            return exact if first is None else first
        return min(first, exact)

    def match_all(self, name: str) -> list[int]:
        """The indexes of every entry that matches `name`, in order."""
        _require_unicode(name)
        return sorted(self._exact.get(self._key(name), []) + self._every_glob(name))

    def _first_glob(self, name: str) -> int | None:
        """The first glob that matches, in one pass; after a timeout, glob by glob."""
        if self._any is None:
            return None
        try:
            hit = self._any.fullmatch(name, timeout=self._timeout)  # 0 times out at once
        except TimeoutError:
            return next(iter(self._slowly(name)), None)
        return None if hit is None else self._each[hit.lastindex - 1][0]

    def _every_glob(self, name: str) -> list[int]:
        """Every glob that matches, in one pass; after a timeout, glob by glob."""
        if self._all is None or self._any is None:
            return []
        try:
            # The alternation fails fast on the common case, a name no glob matches; the
            # lookaheads of `_all` cost one try per glob whether or not any matches.
            if self._any.fullmatch(name, timeout=self._timeout) is None:
                return []
            hit = self._all.match(name, timeout=self._timeout)
        except TimeoutError:
            return list(self._slowly(name))
        return [self._each[n][0] for n, group in enumerate(hit.groups()) if group is not None]

    def _slowly(self, name: str) -> Iterator[int]:
        """The globs that match or, with `timeout_matches`, run out of time, within one more bound."""
        if not self._timeout_matches:
            return  # a timeout never allows: no second chance for an allow list
        deadline = time.monotonic() + self._timeout
        for index, compiled in self._each:
            if _fullmatch(compiled, name, deadline - time.monotonic()) is not False:
                yield index

    def _key(self, entry: str) -> str:
        return entry.casefold() if self._fold else entry

    def __bool__(self) -> bool:
        return bool(self.entries)
