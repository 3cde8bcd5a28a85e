"""Gateway requests/s with and without a tenant Rego policy.

Run: `.venv/bin/python bench/rego_gateway.py [--duration 5]`.

Three gateways in turn (regular mode, plain HTTP, 10 connections, bench/loadclient.py), the
same tenant and allowlist each time: no Rego; Rego (a two-rule module, the shipped decision
module) behind the decision cache (the default; the load repeats one request, so it hits);
Rego with the cache off (`rego.cache.size: 0`), so every request is evaluated by rego-cpp.
Everything stays on loopback and is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "tests"))

import yaml  # noqa: E402
from conftest import SANDGATE, TOKEN, UPSTREAM_IP, tenant_yaml, write_gateway_files  # noqa: E402
from support import RecordingUpstream, wait_for_port  # noqa: E402

MODULE = """package sandgate.tenants.t1

import rego.v1

deny contains {"reason": "method_not_allowed", "message": "only GET and HEAD"} if {
	input.phase == "request"
	not input.request.method in {"GET", "HEAD"}
}

deny contains "only /x and /v1/ paths" if {
	input.phase == "request"
	input.request.path != "/x"
	not startswith(input.request.path, "/v1/")
}
"""


def gateway_row(root: Path, upstream: RecordingUpstream, rego: str | None, duration: float) -> dict[str, Any]:
    doc = yaml.safe_load(tenant_yaml("t1", [{"id": "api", "hosts": ["api.test"], "ports": [upstream.port]}]))
    config: dict[str, Any] = {"log": {"level": "warning"}}
    if rego is not None:
        doc["rego"] = ["t1.rego"]
        if rego == "uncached":
            config["rego"] = {"cache": {"size": 0}}
    path, port = write_gateway_files(root, {"t1.yaml": yaml.safe_dump(doc)}, config=config)
    if rego is not None:
        shutil.copytree(REPO / "rules" / "rego", root / "rules" / "rego")
        (root / "rules" / "tenants" / "t1.rego").write_text(MODULE)
    with open(root / "gateway.log", "wb") as log:
        proc = subprocess.Popen(
            [SANDGATE, "run", "--config", str(path)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_for_port("127.0.0.1", port, timeout=60)
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
        if result["errors"] or set(result["statuses"]) != {"200"}:
            raise RuntimeError(f"the load was not all 200s: {result['statuses']} {result['errors']}")
        return {k: result[k] for k in ("rps", "p50_ms", "p99_ms", "statuses")}
    finally:
        proc.terminate()
        proc.wait(15)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=5.0)
    a = p.parse_args()
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, RecordingUpstream(UPSTREAM_IP, name="bench") as upstream:
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        for name, rego in (("no_rego", None), ("rego_cached", "cached"), ("rego_uncached", "uncached")):
            rows[name] = gateway_row(Path(tmp) / name, upstream, rego, a.duration)
            upstream.reset()
            print(name, rows[name], file=sys.stderr, flush=True)
    json.dump(rows, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
