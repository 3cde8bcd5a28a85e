"""What is left of a policy file that did not validate, so its other problems are found too.

pydantic reports every schema error of a document at once, but the checks that need a valid
model (unknown presets, sandbox tokens and ids, wildcards over a whole top-level domain, ...)
never see a file with one: an unknown key would hide them all. `salvage` drops each top-level
entry that has an error (a whole list item such as `allow.2`, or a whole key such as `limits`)
and validates the rest again, a few rounds at most, keeping positions and field names as
written. Errors the new rounds find were hidden, not caused, by the first: a dropped entry's
own errors were already reported whole, and a round that complains about a dropped entry
(a required key) gives up. The salvaged model is for reporting only: it is never served.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import BaseModel

from sandgate.policy.errors import PolicyLoadError, PolicySetError
from sandgate.policy.model.yamlsource import Loc, YamlDocument, validate

__all__ = ["salvage"]

ROUNDS = 3


def salvage[M: BaseModel](
    model: type[M], doc: YamlDocument, errors: list[PolicyLoadError]
) -> tuple[YamlDocument, M, list[PolicyLoadError]] | None:
    """The document without its broken entries, its model, and the errors found on the way;
    None when nothing valid is left (the document is not a mapping, a required key is bad)."""
    found: list[PolicyLoadError] = []
    dropped: set[Loc] = set()
    current = doc
    pending = errors
    for _ in range(ROUNDS):
        units = {_unit(e.field) for e in pending}
        if () in units or units & dropped or not isinstance(current.data, dict):
            return None
        dropped |= units
        current = _without(current, units)
        try:
            return current, validate(model, current), found
        except PolicySetError as e:
            pending = list(e.errors)
        except PolicyLoadError as e:
            pending = [e]
        found += pending
    return None


def _unit(field: str) -> Loc:
    """The top-level entry an error is in, as written: `('allow', 2)` or `('limits',)`."""
    parts = field.split(".")[:2] if field else []
    if not parts:
        return ()
    if len(parts) == 2 and parts[1].isdigit():
        return (parts[0], int(parts[1]))
    return (parts[0],)


def _without(doc: YamlDocument, units: set[Loc]) -> YamlDocument:
    """`doc` without the entries `units` name (as written), list items renumbered."""
    assert isinstance(doc.data, dict)
    data = dict(doc.data)
    renumbered = dict(doc.renumbered)
    for key in {u[0] for u in units}:
        value = data.get(key)
        if (key,) in units or not isinstance(value, list):
            data.pop(key, None)
            continue
        kept: list[object] = []
        for now, item in enumerate(value):
            written = doc.written((key, now))[1]
            assert isinstance(written, int)
            if (key, written) in units:
                continue
            renumbered[(key, len(kept))] = written
            kept.append(item)
        for stale in range(len(kept), len(value)):
            renumbered.pop((key, stale), None)
        data[key] = kept
    return replace(doc, data=data, renumbered=renumbered)
