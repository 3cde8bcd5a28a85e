"""bench/mcp_gateway.py in its smoke mode, so the script cannot rot: it runs end to end (the pure
decision timings, the MCP SDK server, a real gateway, the SSE upstream) and reports every row.
No figure is asserted beyond being measured: benchmarks are scripts, never timed tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "mcp_gateway.py"


def test_the_mcp_bench_runs_in_its_smoke_mode(tmp_path: Path) -> None:
    out = tmp_path / "mcp.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out), "--markdown", str(tmp_path / "mcp.md")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    rows = {(r["what"], r["extra_rules"]): r for r in results["decisions"]}
    assert set(rows) == {
        ("read and decide", 0),
        ("read and decide", 10),
        ("read and decide", 100),
        ("read only", 0),
    }
    assert all(0 < r["p50_us"] <= r["p99_us"] for r in rows.values())
    latency = results["latency"]["rows"]
    assert set(latency) == {"direct", "gateway"}
    assert all(0 < row["p50_ms"] <= row["p99_ms"] for row in latency.values())
    stream = results["stream"]
    assert stream["events"] == 201, "every SSE event (and the result) read through the gateway too"
    assert all(row["mb_per_s"] > 0 and row["events_per_s"] > 0 for row in stream["rows"].values())
    report = (tmp_path / "mcp.md").read_text()
    assert "## tools/call latency" in report and "gateway / direct, MB/s" in report
    assert done.stdout == report
