"""Path sets for the prover: conjunctions of path-glob languages and their complements.

A glob list is turned into a small NFA that follows `compile_path_globs` token by token
(`/**` as an optional `/...`, `**` across segments, `*` and `?` within one, a sub-delimiter
also as its escape). A set is `U ∩ L(p1) ∩ ... ∩ ¬L(n1) ∩ ...`, where U is the paths the
gateway can read (normal form, no `//`, no dot segment, escapes well formed); its emptiness
is decided, and a shortest member found, by a breadth-first walk of the product automaton.

Exact over a finite alphabet: the characters the globs name, `/`, `%` and the hex digits
(when an escape is possible), and one character standing for every other one (no glob
tells those apart, and U treats them alike). Deny glob lists fold ASCII case. A path the
gateway cannot read unambiguously matches no allow glob and every deny glob list; `*`
(the asterisk form) no glob at all; "every path" (no `paths`) holds both.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ASTERISK_PATH", "UNREADABLE_PATH", "GlobList", "PathSet", "ProofTooLarge"]

# What a counter-example shows for a path that no glob matches but "any path" does: an empty
# segment makes the gateway forward it as sent (policy/paths.py).
UNREADABLE_PATH = "//"
# The asterisk form (`OPTIONS *`): read as "*", matched by no glob, allow or deny.
ASTERISK_PATH = "*"

_ANY = "\x01any"  # any character
_SEGMENT = "\x01seg"  # any character but '/'
# Written in a glob, these match their escape too (matcher._EITHER_SPELLING).
_EITHER_SPELLING = frozenset("!$&'()+,=:@")
_HEX = "0123456789ABCDEF"
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# Escapes the gateway refuses to read (an encoded '/', backslash, NUL, ';'): policy/paths.py.
_AMBIGUOUS = frozenset({0x2F, 0x5C, 0x00, 0x3B})
# Candidates for "any other character": lower-case letters that are not hex digits.
_OTHER_POOL = "xqzjkwvyuto"
_MAX_STATES = 200_000


class ProofTooLarge(Exception):
    """The product automaton grew beyond the bound: the question is left undecided."""


@dataclass(frozen=True, slots=True)
class _Nfa:
    """Edges per state as (predicate, target); epsilon moves already closed over."""

    edges: tuple[tuple[tuple[str, int], ...], ...]
    closure: tuple[frozenset[int], ...]
    start: frozenset[int]
    accept: frozenset[int]
    chars: frozenset[str]

    def step(self, states: frozenset[int], ch: str) -> frozenset[int]:
        out: set[int] = set()
        for s in states:
            for pred, target in self.edges[s]:
                if pred in (ch, _ANY) or (pred == _SEGMENT and ch != "/"):
                    out |= self.closure[target]
        return frozenset(out)


class _Builder:
    def __init__(self, fold: bool) -> None:
        self.edges: list[list[tuple[str, int]]] = []
        self.eps: list[list[int]] = []
        self.chars: set[str] = set()
        self.fold = fold

    def state(self) -> int:
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def edge(self, a: int, pred: str, b: int) -> None:
        if len(pred) != 1:
            self.edges[a].append((pred, b))
            return
        # Folded (deny globs): an ASCII letter matches in either case, as re.IGNORECASE | re.ASCII.
        for ch in {pred.lower(), pred.upper()} if self.fold and pred.isascii() else {pred}:
            self.chars.add(ch)
            self.edges[a].append((ch, b))

    def glob(self, start: int, glob: str) -> int:
        """Add the glob's states after `start`; return its final state."""
        cur, i = start, 0
        while i < len(glob):
            if glob.startswith("/**", i) and glob[i + 3 : i + 4] in ("", "/"):
                after, inside = self.state(), self.state()
                self.eps[cur].append(after)
                self.edge(cur, "/", inside)
                self.edge(inside, _ANY, inside)
                self.eps[inside].append(after)
                cur, i = after, i + 3
            elif glob.startswith("**", i) or glob[i] == "*":
                loop = self.state()
                self.eps[cur].append(loop)
                self.edge(loop, _ANY if glob.startswith("**", i) else _SEGMENT, loop)
                cur, i = loop, i + (2 if glob.startswith("**", i) else 1)
            elif glob[i] == "?":
                nxt = self.state()
                self.edge(cur, _SEGMENT, nxt)
                cur, i = nxt, i + 1
            else:
                nxt = self.state()
                self.edge(cur, glob[i], nxt)
                if glob[i] in _EITHER_SPELLING:
                    p1, p2 = self.state(), self.state()
                    escape = f"{ord(glob[i]):02X}"
                    h1, h2 = escape[0], escape[1]
                    self.edge(cur, "%", p1)
                    self.edge(p1, h1, p2)
                    self.edge(p2, h2, nxt)
                cur, i = nxt, i + 1
        return cur

    def close(self) -> list[frozenset[int]]:
        out = []
        for s in range(len(self.eps)):
            seen, todo = {s}, [s]
            while todo:
                for t in self.eps[todo.pop()]:
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            out.append(frozenset(seen))
        return out


@functools.lru_cache(maxsize=4096)
def _nfa(globs: GlobList) -> _Nfa:
    """One NFA for a list of globs (their union)."""
    b = _Builder(globs.fold)
    start = b.state()
    finals = [b.glob(start, g) for g in sorted(globs.globs)]
    closure = b.close()
    return _Nfa(
        edges=tuple(tuple(e) for e in b.edges),
        closure=tuple(closure),
        start=closure[start],
        accept=frozenset(finals),
        chars=frozenset(b.chars),
    )


# --- the paths the gateway reads (U) -------------------------------------------------------
# States: "S" before the first '/', "B" at a segment's start, "D1"/"D2" in a "."/".." segment,
# "I" inside a segment, "I25"/"I25h" after an escaped '%' (and one hex digit: a double
# encoding if another follows), ("P1", prev) and ("P2", prev, h) inside an escape.
_ACCEPTING = frozenset({"B", "I", "I25", "I25h"})
_VState = str | tuple[str, ...]


def _valid_step(state: _VState, ch: str) -> _VState | None:
    """U's transition on one character, None when no path in U continues this way."""
    if state == "S":
        return "B" if ch == "/" else None
    if isinstance(state, tuple):
        if ch not in _HEX:
            return None
        if state[0] == "P1":
            return ("P2", state[1], ch)
        byte = int(state[2] + ch, 16)
        if chr(byte) in _UNRESERVED or byte in _AMBIGUOUS:
            return None  # an unreserved escape is decoded, never normal; the others unreadable
        return "I25" if byte == 0x25 else "I"
    if ch == "/":
        return None if state in ("B", "D1", "D2") else "B"
    if ch == "%":
        return ("P1", str(state))
    if ch == ";":
        return None
    if ch == ".":
        return {"B": "D1", "D1": "D2"}.get(state, "I")
    if state == "I25" and ch in _HEX:
        return "I25h"
    if state == "I25h" and ch in _HEX:
        return None
    return "I"


@dataclass(frozen=True, slots=True)
class GlobList:
    """A rule's `paths`: the union of its globs. A deny rule's match letters in either case
    and also take every path the gateway cannot read (RuleIndex.deny_match)."""

    globs: frozenset[str]
    deny: bool = False

    @property
    def fold(self) -> bool:
        return self.deny


@dataclass(frozen=True, slots=True)
class PathSet:
    """Paths: every path (`pos` and `neg` empty) narrowed by glob lists it must match (`pos`)
    and must not (`neg`); `empty_set` when a complement of every path was taken.

    Besides the paths the gateway reads, two kinds no allow glob matches: the ones it cannot
    read (UNREADABLE_PATH stands for them; a deny glob list does match them) and `*` (the
    asterisk form, which no glob matches).
    """

    pos: frozenset[GlobList] = frozenset()
    neg: frozenset[GlobList] = frozenset()
    empty_set: bool = False

    @staticmethod
    def of(globs: Iterable[str] | None, *, deny: bool = False) -> PathSet:
        """The paths a rule's `paths` match (None: every path)."""
        return PathSet() if globs is None else PathSet(frozenset({GlobList(frozenset(globs), deny)}))

    def __and__(self, other: PathSet) -> PathSet:
        return PathSet(self.pos | other.pos, self.neg | other.neg, self.empty_set or other.empty_set)

    def __sub__(self, other: PathSet) -> PathSet:
        if other.empty_set:
            return self
        if other.neg:
            raise ValueError("only a glob list (or every path) can be taken away")
        if not other.pos:
            return PathSet(empty_set=True)
        (globs,) = other.pos  # a rule's or a region's paths: one list
        return PathSet(self.pos, self.neg | {globs}, self.empty_set)

    def __bool__(self) -> bool:
        return self.pick() is not None

    def pick(self) -> str | None:
        """A shortest member (a readable path first), or None when the set is empty."""
        return _pick(self)


@functools.lru_cache(maxsize=8192)
def _pick(paths: PathSet) -> str | None:
    if paths.empty_set:
        return None
    pos = sorted(paths.pos, key=lambda g: (sorted(g.globs), g.deny))
    found = _walk(tuple(_nfa(g) for g in pos), tuple(_nfa(g) for g in paths.neg))
    if found is not None:
        return found
    # A path the gateway cannot read: in every glob list that must match only if all are deny
    # lists, and in none that must not.
    if all(g.deny for g in paths.pos) and not any(g.deny for g in paths.neg):
        return UNREADABLE_PATH
    if not paths.pos:
        return ASTERISK_PATH  # matched by no glob at all, allow or deny
    return None


def _walk(pos: tuple[_Nfa, ...], neg: tuple[_Nfa, ...]) -> str | None:
    """Breadth-first over (U state, each NFA's state set): a shortest accepted path, or None."""
    chars: set[str] = set()
    for n in (*pos, *neg):
        chars |= n.chars
    if "%" in chars:
        chars |= set(_HEX)
    other = next(
        (c for c in _OTHER_POOL + "".join(sorted(_UNRESERVED)) if c not in chars and c not in ".~"), None
    )
    if other is None:
        # No character is left to stand for those the globs do not name: without one the
        # walk could miss a path, and a missed path would read as "inside". Undecided instead.
        raise ProofTooLarge("the globs name every character a stand-in could be")
    # The stand-in first: counter-examples read as "/x", not "/%21".
    alphabet = [other, *sorted(chars - {"/"}), "/"]
    start: tuple[_VState, tuple[frozenset[int], ...], tuple[frozenset[int], ...]] = (
        "S",
        tuple(n.start for n in pos),
        tuple(n.start for n in neg),
    )
    parent: dict[object, tuple[object, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        vstate, ps, ns = node
        if (
            vstate in _ACCEPTING
            and all(s & n.accept for s, n in zip(ps, pos, strict=True))
            and not any(s & n.accept for s, n in zip(ns, neg, strict=True))
        ):
            return _spell(parent, node)
        for ch in alphabet:
            v = _valid_step(vstate, ch)
            if v is None:
                continue
            nps = tuple(n.step(s, ch) for s, n in zip(ps, pos, strict=True))
            if not all(nps):
                continue
            nxt = (v, nps, tuple(n.step(s, ch) for s, n in zip(ns, neg, strict=True)))
            if nxt in parent:
                continue
            parent[nxt] = (node, ch)
            if len(parent) > _MAX_STATES:
                raise ProofTooLarge(f"more than {_MAX_STATES} states comparing path globs")
            queue.append(nxt)
    return None


def _spell(parent: dict[object, tuple[object, str] | None], node: object) -> str:
    out: list[str] = []
    link = parent[node]
    while link is not None:
        node, ch = link
        out.append(ch)
        link = parent[node]
    return "".join(reversed(out))
