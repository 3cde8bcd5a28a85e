"""Whether globs of protocol rules can match a common name, with the shortest such name. Pure.

The globs are those of `mcp:`, `jsonrpc:` and `graphql:` sections (sandgate.policy.protocols.
patterns): `*` any run of characters, `?` one character, everything else itself. A glob
matches as written, or (`fold`: deny and ask lists) in any case, as the gateway's regex
engine reads a letter with IGNORECASE: `k` matches `K` and the Kelvin sign, `s` matches
`ſ`, `i` matches `İ` (the engine's simple case folding, asked of the engine itself).

`witness(must, must_not, names)` finds a name of the domain `names` that some glob of every
set in `must` matches and no glob of `must_not` matches. It is decidable and decided
exactly: each set is an automaton determinised as it is walked, over a finite alphabet (each
character a glob names, each character a folded glob's letter matches, and one character
standing for every other one, which no glob tells apart), breadth first, so the name found
is a shortest one, and within `names`' length bound whenever one exists.
"""

from __future__ import annotations

import functools
import string
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import regex  # type: ignore[import-untyped]  # mrab-regex ships no type information

__all__ = [
    "ANY_TEXT",
    "GRAPHQL_NAMES",
    "TOOL_NAMES",
    "Glob",
    "GlobTooLarge",
    "Names",
    "derive",
    "fold_class",
    "matches",
    "witness",
]

# Past this many automaton states the question is left undecided (GlobTooLarge).
MAX_STATES = 100_000
_FLAGS: int = regex.V0 | regex.DOTALL | regex.IGNORECASE  # patterns._glob_flags(fold_case=True)
_STAR, _ONE = "*", "?"


class GlobTooLarge(Exception):
    """The automaton grew past MAX_STATES: not decided."""


@dataclass(frozen=True, slots=True)
class Glob:
    """One glob, matched as written or (`fold`) in any case; `label` names it in reports.

    As the gateway's GlobList reads it: a folded glob with a wildcard is a regex with
    IGNORECASE (a letter matches its fold class), a folded one without is compared after
    `str.casefold` (so `ß` matches `ss`); `key` is the text those compare with."""

    text: str
    fold: bool = False
    label: str = ""

    @property
    def casefolded(self) -> bool:
        """Compared whole after `casefold`, not letter by letter (GlobList's exact entries)."""
        return self.fold and _STAR not in self.text and _ONE not in self.text

    @property
    def key(self) -> str:
        return self.text.casefold() if self.casefolded else self.text


@dataclass(frozen=True, slots=True)
class Names:
    """A domain of names: the characters allowed first and after (None: any character), and
    the length bounds (`longest` None: unbounded)."""

    first: frozenset[str] | None = None
    rest: frozenset[str] | None = None
    shortest: int = 0
    longest: int | None = None


# Any string (JSON-RPC and MCP methods, resource URIs): the reader takes any text.
ANY_TEXT = Names()
# MCP tool and prompt names (sandgate.policy.protocols.mcp.TOOL_NAME).
_TOOL_CHARS = frozenset(string.ascii_letters + string.digits + "_.:/-")
TOOL_NAMES = Names(_TOOL_CHARS, _TOOL_CHARS, 1, 128)
# GraphQL names: [_A-Za-z][_0-9A-Za-z]*.
GRAPHQL_NAMES = Names(
    frozenset(string.ascii_letters + "_"), frozenset(string.ascii_letters + string.digits + "_"), 1
)


@functools.cache
def _cased() -> tuple[str, ...]:
    """Every character with a case mapping: the only ones a folded letter can match."""
    out = []
    for i in range(0x110000):
        ch = chr(i)
        if ch.lower() != ch or ch.upper() != ch or ch.casefold() != ch:
            out.append(ch)
    return tuple(out)


@functools.cache
def fold_class(ch: str) -> frozenset[str]:
    """The characters a glob's `ch` matches in any case (the engine's answer, not a table)."""
    pattern = regex.compile(regex.escape(ch, special_only=False), _FLAGS)
    return frozenset(x for x in _cased() if pattern.fullmatch(x)) | {ch}


def _matches(literal: str, fold: bool, ch: str) -> bool:
    return ch == literal or (fold and ch in fold_class(literal))


# An automaton state: (glob index, position in its text); a set of them is a state walked.
type _State = frozenset[tuple[int, int]]


def _close(globs: Sequence[Glob], states: Iterable[tuple[int, int]]) -> _State:
    """`states` with the positions after each `*` (a star matches nothing too)."""
    out = set()
    for g, p in states:
        text = globs[g].key
        while True:
            out.add((g, p))
            if p < len(text) and text[p] == _STAR:
                p += 1
            else:
                break
    return frozenset(out)


def _step(globs: Sequence[Glob], states: _State, ch: str) -> _State:
    moved = []
    for g, p in states:
        glob = globs[g]
        if glob.casefolded:
            folded = ch.casefold()
            if glob.key.startswith(folded, p):
                moved.append((g, p + len(folded)))
            continue
        if p == len(glob.text):
            continue
        token = glob.text[p]
        if token == _STAR:
            moved.append((g, p))
        elif token == _ONE or _matches(token, glob.fold, ch):
            moved.append((g, p + 1))
    return _close(globs, moved)


def _accepts(globs: Sequence[Glob], states: _State) -> bool:
    return any(p == len(globs[g].key) for g, p in states)


def matches(glob: Glob, name: str) -> bool:
    """Whether `glob` matches `name`, as the gateway's GlobList would."""
    globs = (glob,)
    states = _close(globs, [(0, 0)])
    for ch in name:
        states = _step(globs, states, ch)
    return _accepts(globs, states)


def derive(glob: Glob, prefix: str) -> tuple[Glob, ...]:
    """Globs that match `name` exactly when `glob` matches `prefix + name` (a casefolded
    entry whose key does not start with the folded prefix: none)."""
    if glob.casefolded:
        rest = glob.key.removeprefix(prefix.casefold())
        return (Glob(rest, True, glob.label),) if rest != glob.key or not prefix else ()
    globs = (glob,)
    states = _close(globs, [(0, 0)])
    for ch in prefix:
        states = _step(globs, states, ch)
    return tuple(Glob(glob.text[p:], glob.fold, glob.label) for _, p in sorted(states))


def _alphabet(sets: Iterable[Sequence[Glob]], names: Names) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The characters to try first and after: each one some glob tells apart, and one
    standing for all the others (in `names`' domain each time)."""
    named: set[str] = set()
    for globs in sets:
        for glob in globs:
            if glob.casefolded:
                named |= _folding_into(glob.key)
                continue
            for ch in glob.text:
                if ch not in (_STAR, _ONE):
                    named |= fold_class(ch) if glob.fold else {ch}
    return _pick(named, names.first), _pick(named, names.rest)


def _folding_into(key: str) -> set[str]:
    """The characters whose casefold is a piece of `key` (a casefolded entry)."""
    return {ch for ch in (*key, *_cased()) if ch.casefold() in key}


def _pick(named: set[str], allowed: frozenset[str] | None) -> tuple[str, ...]:
    # Lower case first: `delete_x` reads better than `DELETE_X` in a report.
    chars = sorted(named if allowed is None else named & allowed, key=lambda c: (not c.islower(), c))
    pool = sorted(allowed) if allowed is not None else "xqzjkwv0123456789~é"
    other = next((ch for ch in pool if ch not in named), None)
    if other is None and allowed is None:
        other = next(chr(i) for i in range(0x4E00, 0x110000) if chr(i) not in named)
    return (*chars, other) if other is not None else tuple(chars)


def witness(
    must: Sequence[Sequence[Glob]], must_not: Sequence[Glob] = (), names: Names = ANY_TEXT
) -> str | None:
    """A shortest name in `names` that a glob of every set in `must` matches and no glob of
    `must_not` matches, or None when there is none. GlobTooLarge past MAX_STATES."""
    if not must or any(not globs for globs in must):
        return None
    sets = (*must, must_not)
    first, rest = _alphabet(sets, names)
    start = tuple(_close(globs, [(i, 0) for i in range(len(globs))]) for globs in sets)
    queue: deque[tuple[tuple[_State, ...], str]] = deque([(start, "")])
    seen = {(start, False)}
    while queue:
        states, name = queue.popleft()
        if len(name) >= names.shortest and _found(sets, states):
            return name
        if names.longest is not None and len(name) >= names.longest:
            continue
        for ch in first if not name else rest:
            after = tuple(_step(globs, s, ch) for globs, s in zip(sets, states, strict=True))
            if any(not s for s in after[:-1]) or (after, True) in seen:
                continue  # a `must` set can no longer match: nothing down this way
            seen.add((after, True))
            if len(seen) > MAX_STATES:
                raise GlobTooLarge(f"more than {MAX_STATES} automaton states")
            queue.append((after, name + ch))
    return None


def _found(sets: Sequence[Sequence[Glob]], states: tuple[_State, ...]) -> bool:
    *musts, never = states
    return all(_accepts(g, s) for g, s in zip(sets[:-1], musts, strict=True)) and not _accepts(
        sets[-1], never
    )
