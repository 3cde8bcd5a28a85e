"""What a sink sends for one trail line: events with a stable id, in the sink's format.

`native` sends the record itself (its id: `decision_id`, as the fleet stream dedupes by);
`ocsf` sends the OCSF events rendered from it (their id: `metadata.uid`; a record that is no
event renders none). The id is the same every time a line is encoded, so a receiver can drop
what a retry or a restart sent twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sandgate.proxy.audit.ocsf.events import ocsf_events
from sandgate.proxy.audit.redis_stream import record_id

__all__ = ["Event", "encode_lines", "record_time"]

Format = Literal["native", "ocsf"]


@dataclass(frozen=True, slots=True)
class Event:
    """One event to deliver: its id, its body, and what transports put beside the body."""

    uid: str
    body: Mapping[str, Any]
    time: float  # epoch seconds
    kind: str  # the record's event or the OCSF class name
    tenant: str
    sandbox: str

    def json(self) -> str:
        return json.dumps(self.body, separators=(",", ":"), default=str)


def record_time(record: Mapping[str, Any]) -> float:
    """The record's time as epoch seconds (now when it has none that parses)."""
    t = record.get("time")
    if isinstance(t, (int, float)):
        return float(t)
    if isinstance(t, str):
        try:
            return datetime.fromisoformat(t).timestamp()
        except ValueError:
            pass
    return time.time()


def encode_lines(lines: list[str], fmt: Format) -> list[Event]:
    """The events of `lines`, in order (a line that is not a JSON object is sent as `raw`)."""
    out: list[Event] = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            record = {"raw": line.rstrip("\n")}
        out.extend(_native(line, record) if fmt == "native" else _ocsf(line, record))
    return out


def _native(line: str, record: dict[str, Any]) -> list[Event]:
    return [
        Event(
            uid=record_id(line),
            body=record,
            time=record_time(record),
            kind=str(record.get("event") or "decision"),
            tenant=str(record.get("tenant") or ""),
            sandbox=str(record.get("sandbox") or ""),
        )
    ]


def _ocsf(line: str, record: dict[str, Any]) -> list[Event]:
    out = []
    for i, event in enumerate(ocsf_events(record)):
        meta = event.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        ms = event.get("time")
        out.append(
            Event(
                # Never without an id: the record's, numbered (the mapping's rendering is stable).
                uid=str(uid) if uid else f"{record_id(line)}.{i}",
                body=event,
                time=ms / 1000 if isinstance(ms, (int, float)) else record_time(record),
                kind=str(event.get("class_name") or event.get("class_uid") or "event"),
                tenant=str(record.get("tenant") or ""),
                sandbox=str(record.get("sandbox") or ""),
            )
        )
    return out
