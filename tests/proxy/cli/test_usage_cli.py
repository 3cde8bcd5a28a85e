"""`sandgate usage` as a subprocess, on a seeded trail (tests/proxy/audit/test_usage.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandgate.proxy.cli.main import main

# Two requests of sandbox sb1, in two hours, as the gateway writes them (fields usage reads, and more).
TRAIL = [
    {
        "event": "decision",
        "v": 1,
        "time": "2026-12-03T04:59:59.999Z",
        "decision_id": "r1",
        "tenant": "t1",
        "sandbox": "sb1",
        "phase": "request",
        "decision": "allow",
        "reason": "allowed",
        "credentials": ["gh"],
        "status": 200,
        "bytes": {"up": 3, "down": 40},
        "duration_ms": 12.5,
    },
    {
        "event": "decision",
        "v": 1,
        "time": "2026-12-03T05:00:00.000Z",
        "decision_id": "r2",
        "tenant": "t1",
        "sandbox": "sb1",
        "phase": "request",
        "decision": "deny",
        "reason": "host_not_allowed",
        "credentials": [],
        "status": None,
        "bytes": {"up": None, "down": None},
        "duration_ms": 0.2,
    },
]
EXPECTED_CSV = """\
hour,tenant,sandbox,requests,connections,allowed,denied,bytes_up,bytes_down,upstream_ms,approvals,approval_wait_seconds,credentials
2026-12-03T04:00Z,t1,sb1,1,0,1,0,3,40,12.5,0,0,gh=1
2026-12-03T05:00Z,t1,sb1,1,0,0,1,0,0,0,0,0,
"""


def write_trail(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TRAIL) + "not json\n")
    return path


def test_usage_prints_csv_and_counts_skipped_lines_on_stderr(tmp_path: Path) -> None:
    path = write_trail(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "sandgate.proxy.cli.main", "usage", "--file", str(path), "--format", "csv"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, EXPECTED_CSV)
    assert done.stderr == "sandgate usage: skipped 1 malformed line or record\n"


def test_usage_since_by_tenant_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_trail(tmp_path)
    code = main(
        ["usage", "--file", str(path), "--by", "tenant", "--since", "2026-12-03T05:00Z", "--format", "json"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert [(r["hour"], r["tenant"], r["denied"], "sandbox" in r) for r in json.loads(out)] == [
        ("2026-12-03T05:00Z", "t1", 1, False)
    ]


def test_usage_without_a_trail_is_a_usage_error(tmp_path: Path) -> None:
    assert main(["usage", "--file", str(tmp_path / "audit.jsonl")]) == 2
