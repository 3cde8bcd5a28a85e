""" "Suggest rules" for one sandbox: `sandgate audit suggest --sandbox ID` over the last day of
the trail (the fleet's stream in a fleet), by the same code (sandgate.proxy.audit.suggest), so
the page and the command never disagree. The text is YAML to review, shown as text."""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

from sandgate.proxy.audit.files import Source
from sandgate.proxy.audit.query import Query
from sandgate.proxy.audit.suggest import collect, render_suggestions

__all__ = ["MIN_COUNT", "WINDOW", "read_suggestion"]

# How far back the page looks, and the denials a rule needs (`audit suggest`'s default).
WINDOW = timedelta(hours=24)
MIN_COUNT = 2


def read_suggestion(source: Source, sandbox: str, tenant: str | None, now: datetime) -> str:
    """The suggested rules for `sandbox` (of `tenant`) from the trail's last day (blocking: run
    it in a thread); AuditInputError when the trail cannot be read."""
    query = Query(
        sandboxes=frozenset({sandbox}),
        # A sandbox id of another tenant's earlier sandbox is not this one's evidence.
        tenants=frozenset({tenant}) if tenant else frozenset(),
        since=now - WINDOW,
        until=now,
    )
    with contextlib.closing(source.records(query)) as records:
        evidence = collect(records, sandbox)
    return render_suggestions(evidence, MIN_COUNT)
