"""docs/reference/ocsf.md cannot drift: each sample's events are what `ocsf_events` makes of
its record today, each validates against the OCSF 1.8.0 schema, and every class is shown."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.ocsf_schema import validate_event

from sandgate.proxy.audit.ocsf.events import ocsf_events
from sandgate.proxy.version import version_of

PAGE = Path(__file__).resolve().parents[4] / "docs" / "reference" / "ocsf.md"
_SAMPLE = re.compile(
    r"^### (?P<title>.+?)\n\nThe record:\n\n```json\n(?P<record>.+?)\n```\n\nIts events:\n\n```json\n(?P<events>.+?)\n```",
    re.S | re.M,
)


def samples() -> list[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    found = [
        (m["title"], json.loads(m["record"]), json.loads(m["events"]))
        for m in _SAMPLE.finditer(PAGE.read_text())
    ]
    assert len(found) == PAGE.read_text().count("\n### "), "a sample the pattern does not read"
    return found


def _as_installed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page's events with this install's sandgate version (the page shows the one it was made with)."""
    for event in events:
        event["metadata"]["product"]["version"] = version_of("sandgate")
    return events


@pytest.mark.parametrize(("title", "record", "events"), samples(), ids=[s[0] for s in samples()])
def test_a_sample_is_what_ocsf_events_makes_of_its_record(
    title: str, record: dict[str, Any], events: list[dict[str, Any]]
) -> None:
    assert ocsf_events(record) == _as_installed(events), f"regenerate the sample {title!r}"
    for event in events:
        validate_event(event)


def test_the_page_shows_a_sample_of_every_class() -> None:
    shown = {e["class_uid"] for _, _, events in samples() for e in events}
    assert shown == {4001, 4002, 4003, 2004, 5019}
    assert "OCSF **1.8.0**" in PAGE.read_text()
