"""Usage per hour and sandbox over a seeded trail: two hours, two sandboxes, approvals, credentials."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from sandgate.policy.decision import Decision, Identity, Mode, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.audit.files import JsonlSource
from sandgate.proxy.audit.query import Query
from sandgate.proxy.audit.records import DecisionContext, decision_record, format_time
from sandgate.proxy.audit.usage import UsageCollector, hour_bucket
from sandgate.proxy.cli.usage import render

BASE = datetime(2026, 12, 3, 4, 0, tzinfo=UTC)


def record(
    minutes: float,
    sandbox: str,
    *,
    phase: Phase = Phase.REQUEST,
    reason: Reason = Reason.ALLOWED,
    up: int | None = None,
    down: int | None = None,
    duration_ms: float = 0.0,
    credentials: tuple[str, ...] = (),
    approval: tuple[str, str | None] | None = None,
    waited: float | None = None,
    ask: bool = False,
) -> dict[str, Any]:
    """A decision record as the gateway writes it, at BASE + `minutes`, of tenant t1."""
    ctx = DecisionContext(
        phase=phase,
        listener="regular@127.0.0.1:8080",
        client="127.0.0.1:40000",
        host="api.test",
        port=443,
        method="GET" if phase is Phase.REQUEST else None,
        path="/" if phase is Phase.REQUEST else None,
        identity=Identity("t1", sandbox),
        waited=waited,
    )
    allowed = reason is Reason.ALLOWED
    decision = Decision(
        allowed=allowed,
        reason=reason,
        rule_id="t1/allow/api",
        policy_version="a4c4c1347d42",
        mode=Mode.ENFORCE,
        address="127.0.0.2" if allowed else None,
        approval=approval,
    )
    out = decision_record(
        ctx, decision, status=200 if allowed else None, bytes_up=up, bytes_down=down, credentials=credentials
    )
    if ask:
        out["decision"] = "ask"  # as sandgate.proxy.approvals.holds writes a held request's record
        out["approval_id"] = "a1"
    out["time"] = format_time((BASE + timedelta(minutes=minutes)).timestamp())
    out["duration_ms"] = duration_ms  # fixed, not measured
    return out


TRAIL = [
    # 04:00-05:00, sb1: a CONNECT, two allowed requests (one with a credential), a denied one.
    record(1, "sb1", phase=Phase.CONNECT, duration_ms=0.5),
    record(2, "sb1", up=100, down=2000, duration_ms=40.0, credentials=("gh",)),
    record(3, "sb1", up=50, down=500, duration_ms=10.0),
    record(4, "sb1", reason=Reason.HOST_NOT_ALLOWED, duration_ms=0.1),
    # sb2: a request held for approval (its ask record, then its end after 2.5 s), credentials.
    record(10, "sb2", reason=Reason.APPROVAL_REQUIRED, ask=True),
    record(
        11,
        "sb2",
        up=10,
        down=20,
        duration_ms=2600.0,
        credentials=("gh", "npm"),
        approval=("a1", "alice"),
        waited=2.5,
    ),
    # 05:00-06:00, sb1: one allowed request.
    record(70, "sb1", up=7, down=8, duration_ms=3.0, credentials=("gh",)),
]

EXPECTED_CSV = """\
hour,tenant,sandbox,requests,connections,allowed,denied,bytes_up,bytes_down,upstream_ms,approvals,approval_wait_seconds,credentials
2026-12-03T04:00Z,t1,sb1,3,1,3,1,150,2500,50,0,0,gh=1
2026-12-03T04:00Z,t1,sb2,1,0,1,0,10,20,100,1,2.5,gh=1;npm=1
2026-12-03T05:00Z,t1,sb1,1,0,1,0,7,8,3,0,0,gh=1
"""


@pytest.fixture
def trail(tmp_path: Path) -> Path:
    """The trail in two files (the older rotated), with a malformed line in the live one."""
    path = tmp_path / "audit.jsonl"
    (tmp_path / "audit.jsonl.1").write_text("".join(json.dumps(r) + "\n" for r in TRAIL[:4]))
    lines = [json.dumps(r) for r in TRAIL[4:]]
    lines.insert(1, '{"event":"decision","tenant":"t1",')  # cut short by a crash
    path.write_text("\n".join(lines) + "\n")
    return path


def collect(path: Path, by: str = "sandbox", since: datetime | None = None) -> tuple[UsageCollector, int]:
    source = JsonlSource(path)
    collector = UsageCollector("tenant" if by == "tenant" else "sandbox")
    collector.add_all(source.records(Query(since=since)))
    return collector, source.malformed


def test_csv_counts_every_column_per_hour_and_sandbox(trail: Path) -> None:
    collector, malformed = collect(trail)
    assert render(collector.rows(), "sandbox", "csv") == EXPECTED_CSV
    assert malformed == 1


def test_json_is_an_array_of_rows_by_tenant(trail: Path) -> None:
    collector, _ = collect(trail, by="tenant")
    rows = json.loads(render(collector.rows(), "tenant", "json"))
    assert rows == [
        {
            "hour": "2026-12-03T04:00Z",
            "tenant": "t1",
            "requests": 4,
            "connections": 1,
            "allowed": 4,
            "denied": 1,
            "bytes_up": 160,
            "bytes_down": 2520,
            "upstream_ms": 150.0,
            "approvals": 1,
            "approval_wait_seconds": 2.5,
            "credentials": {"gh": 2, "npm": 1},
        },
        {
            "hour": "2026-12-03T05:00Z",
            "tenant": "t1",
            "requests": 1,
            "connections": 0,
            "allowed": 1,
            "denied": 0,
            "bytes_up": 7,
            "bytes_down": 8,
            "upstream_ms": 3.0,
            "approvals": 0,
            "approval_wait_seconds": 0.0,
            "credentials": {"gh": 1},
        },
    ]


def test_since_leaves_out_earlier_hours(trail: Path) -> None:
    collector, _ = collect(trail, since=BASE + timedelta(hours=1))
    assert [(r["hour"], r["sandbox"], r["requests"]) for r in collector.rows()] == [
        ("2026-12-03T05:00Z", "sb1", 1)
    ]


@pytest.mark.parametrize(
    "broken",
    [
        {"time": "not a time"},
        {"time": None},
        {"credentials": "gh"},
        {"credentials": [1]},
        {"sandbox": ["sb1"]},
        {"bytes": "lots"},
    ],
    ids=[
        "an unreadable time",
        "no time",
        "credentials not a list",
        "a credential not a name",
        "a sandbox not a name",
        "bytes not an object",
    ],
)
def test_a_record_with_unreadable_fields_is_skipped_or_counted_safely(broken: dict[str, Any]) -> None:
    collector = UsageCollector()
    collector.add({**TRAIL[1], **broken})
    rows = collector.rows()
    if "bytes" in broken:
        # Bytes that are not counts count as none; the request still counts.
        assert collector.skipped == 0
        assert (rows[0]["requests"], rows[0]["bytes_up"], rows[0]["bytes_down"]) == (1, 0, 0)
    else:
        assert (collector.skipped, rows) == (1, [])


def test_records_of_other_events_are_not_usage() -> None:
    collector = UsageCollector()
    collector.add({**TRAIL[1], "event": "policy_reload"})
    assert (collector.skipped, collector.rows()) == (0, [])


def test_hours_are_utc_whatever_the_offset() -> None:
    moment = datetime(2026, 12, 3, 8, 59, 59, tzinfo=timezone(timedelta(hours=2)))
    assert hour_bucket(moment) == "2026-12-03T06:00Z"


def test_table_aligns_columns_and_shows_no_identity_as_dash() -> None:
    collector = UsageCollector()
    collector.add({**TRAIL[3], "tenant": None, "sandbox": None})
    lines = render(collector.rows(), "sandbox", "table").splitlines()
    assert lines[0].split() == [
        "hour",
        "tenant",
        "sandbox",
        "requests",
        "connections",
        "allowed",
        "denied",
        "bytes_up",
        "bytes_down",
        "upstream_ms",
        "approvals",
        "approval_wait_seconds",
        "credentials",
    ]
    assert lines[1].split() == [
        "2026-12-03T04:00Z",
        "-",
        "-",
        "1",
        "0",
        "0",
        "1",
        "0",
        "0",
        "0",
        "0",
        "0",
        "-",
    ]


def test_csv_by_tenant_has_no_sandbox_column(trail: Path) -> None:
    collector, _ = collect(trail, by="tenant")
    assert render(collector.rows(), "tenant", "csv").splitlines()[:2] == [
        "hour,tenant,requests,connections,allowed,denied,bytes_up,bytes_down,upstream_ms,approvals,"
        "approval_wait_seconds,credentials",
        "2026-12-03T04:00Z,t1,4,1,4,1,160,2520,150,1,2.5,gh=2;npm=1",
    ]
