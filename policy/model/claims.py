"""Sandbox ids claimed by two tenant files: which definition is blamed, naming both.

The blamed definition is the newcomer, decided the same way on every load:
  1. a sandbox the previous policy gave to a tenant stays with that tenant (a reload never
     moves a running sandbox because another file was edited);
  2. a file that loads keeps it over one that does not (a broken file's claim is only reported);
  3. the file modified last is the newcomer (the one just edited; modification times are a
     hint, so both places are always named);
  4. between equal times, the later path.
No I/O here: the loader passes each file's modification time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sandgate.policy.errors import SourceLocation

__all__ = ["Claim", "Conflict", "conflicts"]


@dataclass(frozen=True, slots=True)
class Claim:
    """One definition of a sandbox id in one tenant file."""

    sandbox: str
    tenant: str
    file: str
    where: SourceLocation
    # Its index in the file's `sandboxes:` list (as loaded), for the error in that file.
    index: int
    loads: bool
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class Conflict:
    """A claim that loses, and the text of its error."""

    claim: Claim
    problem: str


def conflicts(claims: Iterable[Claim], previous_owner: Mapping[str, str]) -> list[Conflict]:
    """Every losing claim of an id that two files claim. `previous_owner`: sandbox id → the
    tenant the previous policy registered it to."""
    by_id: dict[str, list[Claim]] = {}
    for claim in claims:
        by_id.setdefault(claim.sandbox, []).append(claim)
    out: list[Conflict] = []
    for sandbox, found in by_id.items():
        if len({c.file for c in found}) < 2:
            continue  # twice in one file is that file's own error
        owner = previous_owner.get(sandbox)

        def rank(c: Claim, owner: str | None = owner) -> tuple[bool, bool, int, str]:
            return (c.tenant != owner, not c.loads, c.mtime_ns, c.file)

        ordered = sorted(found, key=rank)
        keeper = ordered[0]
        for claim in ordered[1:]:
            if claim.file == keeper.file:
                continue
            out.append(Conflict(claim, _problem(claim, keeper, owner)))
    return out


def _problem(claim: Claim, keeper: Claim, owner: str | None) -> str:
    text = f"sandbox {claim.sandbox!r} is also defined in {keeper.where} (tenant {keeper.tenant!r})"
    if keeper.tenant == owner and claim.tenant != owner:
        why = f"it is registered to tenant {owner!r} now and stays there"
    elif keeper.loads and not claim.loads:
        why = "that file loads"
    elif claim.mtime_ns != keeper.mtime_ns:
        why = "this file changed after that one"
    else:
        why = "this file comes later by name"
    return f"{text}; {why}: remove it from one of them"
