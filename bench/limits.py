"""Tenant limits: the limiter's cost per decision, and gateway req/s with limits vs none.

Run: `.venv/bin/python bench/limits.py [--duration 5] [--decisions 200000]`.
The gateway rows run `sandgate run` (regular mode, plain HTTP) in front of a loopback
upstream and drive it with bench/loadclient.py; the limit is set high enough never to refuse,
so the row measures the counting, not refusals. Everything stays on loopback and is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "tests"))

import yaml  # noqa: E402
from conftest import SANDGATE, TOKEN, UPSTREAM_IP, tenant_yaml, write_gateway_files  # noqa: E402
from support import RecordingUpstream, wait_for_port  # noqa: E402

from sandgate.policy.limiter import Limiter  # noqa: E402
from sandgate.policy.model.tenant import Limits  # noqa: E402


def decision_cost(count: int) -> dict[str, float]:
    """µs per Limiter.admit with per-sandbox and tenant request and byte caps (1,000 sandboxes)."""
    limiter = Limiter()
    limits = Limits(
        requests_per_minute=10**9,
        tenant_requests_per_minute=10**9,
        egress_bytes_per_hour=10**12,
        tenant_egress_bytes_per_hour=10**12,
    )
    samples = []
    for i in range(count):
        sandbox = f"sb{i % 1000}"
        t0 = time.perf_counter_ns()
        limiter.admit("t1", sandbox, limits, egress_bytes=300)
        samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    return {
        "decisions": count,
        "p50_us": samples[len(samples) // 2] / 1000,
        "p99_us": samples[int(len(samples) * 0.99)] / 1000,
    }


def gateway_row(
    root: Path, upstream: RecordingUpstream, limits: dict[str, int] | None, duration: float
) -> dict[str, object]:
    doc = yaml.safe_load(tenant_yaml("t1", [{"id": "api", "hosts": ["api.test"], "ports": [upstream.port]}]))
    if limits:
        doc["limits"] = limits
    config, port = write_gateway_files(
        root, {"t1.yaml": yaml.safe_dump(doc)}, config={"log": {"level": "warning"}}
    )
    with open(root / "gateway.log", "wb") as log:
        proc = subprocess.Popen(
            [SANDGATE, "run", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_for_port("127.0.0.1", port, timeout=30)
        out = subprocess.run(
            [
                sys.executable, str(BENCH / "loadclient.py"),
                "--address", f"127.0.0.1:{port}", "--url", f"http://api.test:{upstream.port}/x",
                "--proxy", "--auth", f"sb1:{TOKEN}", "--concurrency", "10",
                "--duration", str(duration), "--warmup", "1",
            ],
            capture_output=True, text=True, timeout=duration + 60, check=True,
        )  # fmt: skip
        result = json.loads(out.stdout)
        return {k: result[k] for k in ("rps", "p50_ms", "p99_ms", "errors", "statuses")}
    finally:
        proc.terminate()
        proc.wait(15)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--decisions", type=int, default=200_000)
    a = p.parse_args()
    rows: dict[str, object] = {"limiter": decision_cost(a.decisions)}
    with tempfile.TemporaryDirectory() as tmp, RecordingUpstream(UPSTREAM_IP, name="bench") as upstream:
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        rows["gateway_no_limits"] = gateway_row(Path(tmp) / "a", upstream, None, a.duration)
        upstream.reset()
        big = {"requests_per_minute": 10**9, "egress_bytes_per_hour": 10**12, "request_body_bytes": 10**9}
        rows["gateway_with_limits"] = gateway_row(Path(tmp) / "b", upstream, big, a.duration)
    json.dump(rows, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
