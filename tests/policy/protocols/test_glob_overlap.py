"""sandgate.policy.protocols.glob_overlap: a shortest name that globs share, exactly as the
gateway's GlobList matches them (allow as written, deny in any case), or None."""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Sequence

import pytest

from sandgate.policy.protocols.glob_overlap import (
    ANY_TEXT,
    GRAPHQL_NAMES,
    TOOL_NAMES,
    Glob,
    Names,
    derive,
    fold_class,
    witness,
)
from sandgate.policy.protocols.patterns import GlobList


def allow(*globs: str) -> list[Glob]:
    return [Glob(g) for g in globs]


def deny(*globs: str) -> list[Glob]:
    return [Glob(g, fold=True) for g in globs]


CASES: dict[str, tuple[list[Glob], list[Glob], list[Glob], Names, str | None]] = {
    "any tool meets a deny glob": (allow("*"), deny("delete_*"), [], TOOL_NAMES, "delete_"),
    "disjoint prefixes never meet": (allow("get_*"), deny("delete_*"), [], TOOL_NAMES, None),
    "an allow glob in another case meets a deny glob": (
        allow("Delete_*"),
        deny("delete_*"),
        [],
        TOOL_NAMES,
        "Delete_",
    ),
    "the tenant's own deny glob takes the overlap away": (
        allow("*"),
        deny("delete_*"),
        deny("DELETE*"),
        TOOL_NAMES,
        None,
    ),
    "an exact tenant deny leaves the rest of the overlap": (
        allow("*"),
        deny("delete_*"),
        deny("delete_"),
        TOOL_NAMES,
        "delete_a",
    ),
    "a suffix meets a prefix": (allow("*_repo"), deny("delete_*"), [], TOOL_NAMES, "delete_repo"),
    "question marks count characters": (allow("??"), deny("???"), [], ANY_TEXT, None),
    "a star meets a question mark": (allow("a*"), deny("?b"), [], ANY_TEXT, "ab"),
    "a tool name has at least one character": (allow("*"), deny("*"), [], TOOL_NAMES, "a"),
    "a tool name has no space": (allow("a*"), deny("a b"), [], TOOL_NAMES, None),
    "a tool name is at most 128 characters": (
        allow("a" * 120 + "*"),
        deny("*" + "b" * 10),
        [],
        TOOL_NAMES,
        None,
    ),
    "any text may be longer": (
        allow("a" * 120 + "*"),
        deny("*" + "b" * 10),
        [],
        ANY_TEXT,
        "a" * 120 + "b" * 10,
    ),
    "the Kelvin sign is a k to a folded glob": (allow("*\u212a"), deny("*k"), [], ANY_TEXT, "\u212a"),
    "the long s is an s to a folded glob": (allow("\u017f*"), deny("s*"), [], ANY_TEXT, "\u017f"),
    "an exact folded entry compares casefolded (sharp s is ss)": (
        allow("stra\u00dfe"),
        deny("STRASSE"),
        [],
        ANY_TEXT,
        "stra\u00dfe",
    ),
    "as written, case matters": (allow("abc"), allow("ABC"), [], ANY_TEXT, None),
    "a graphql name starts with no digit": (
        allow("*"),
        deny("?x"),
        deny("_x", "[a-z]x"),
        GRAPHQL_NAMES,
        "ax",
    ),
    "an empty set meets nothing": (allow("*"), [], [], ANY_TEXT, None),
}


@pytest.mark.parametrize(("a", "d", "minus", "names", "expected"), CASES.values(), ids=CASES.keys())
def test_witness(a: list[Glob], d: list[Glob], minus: list[Glob], names: Names, expected: str | None) -> None:
    found = witness([a, d], minus, names)
    if expected is None:
        assert found is None
        return
    assert found is not None and len(found) == len(expected)
    assert _holds([a, d], minus, found)


def test_fold_classes_are_the_engines() -> None:
    assert fold_class("k") == {"k", "K", "\u212a"}
    assert fold_class("s") == {"s", "S", "\u017f"}
    assert fold_class("_") == {"_"}
    # Not an equivalence: `i` matches the dotted capital, `I` the dotless small letter.
    assert "\u0130" in fold_class("i") and "\u0131" in fold_class("I")


def test_derive_takes_a_prefix_off() -> None:
    texts = {g.text for g in derive(Glob("mutation.delete*", fold=True), "MUTATION.")}
    assert texts == {"delete*"}
    assert {g.text for g in derive(Glob("*.x"), "query.")} == {"*.x", ".x", "x"}
    assert derive(Glob("query.a", fold=True), "mutation.") == ()
    assert {g.text for g in derive(Glob("Query.a", fold=True), "query.")} == {"a"}


@functools.cache
def _compiled(glob: Glob) -> GlobList:
    return GlobList([glob.text], fold_case=glob.fold)


def _matches(glob: Glob, name: str) -> bool:
    return _compiled(glob).match(name) is not None


def _holds(must: Sequence[Sequence[Glob]], must_not: Sequence[Glob], name: str) -> bool:
    return all(any(_matches(g, name) for g in gs) for gs in must) and not any(
        _matches(g, name) for g in must_not
    )


# Glob characters and name characters with every folding quirk: Kelvin, long s, sharp s.
_GLOB_CHARS = ["a", "A", "k", "s", "S", "\u00df", "*", "?"]
_NAME_CHARS = ["a", "A", "k", "K", "\u212a", "s", "S", "\u017f", "\u00df", "\u1e9e", "x"]
_NAMES = ["".join(p) for n in range(4) for p in itertools.product(_NAME_CHARS, repeat=n)]


def _random_glob(rng: random.Random, fold: bool) -> Glob:
    return Glob("".join(rng.choice(_GLOB_CHARS) for _ in range(rng.randint(1, 3))), fold)


def test_witness_agrees_with_the_gateways_matching_on_every_short_name() -> None:
    """Against GlobList itself, on every name of up to 3 characters: the witness found holds,
    and is never longer than the shortest name that holds (none found: none holds)."""
    rng = random.Random(20240607)
    for _ in range(120):
        must = [
            [_random_glob(rng, rng.random() < 0.5) for _ in range(rng.randint(1, 2))],
            [_random_glob(rng, True) for _ in range(rng.randint(1, 2))],
        ]
        must_not = [_random_glob(rng, True) for _ in range(rng.randint(0, 2))]
        found = witness(must, must_not, ANY_TEXT)
        brute = next((n for n in _NAMES if _holds(must, must_not, n)), None)
        context = f"{must} minus {must_not}: witness {found!r}, brute force {brute!r}"
        if found is not None:
            assert _holds(must, must_not, found), context
        if brute is not None:
            assert found is not None and len(found) <= len(brute), context
        elif found is not None:
            assert len(found) > 3, context
