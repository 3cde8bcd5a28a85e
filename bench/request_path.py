"""What one request costs in sandgate's own code: hook calls, modules touched, decisions.

Run: `.venv/bin/python bench/request_path.py [--requests 20] [--json]`.

One gateway (one worker, the passthrough front on, its defaults otherwise) runs under a
counter of every call into sandgate's own modules (proxy/, policy/, brokers/): each start of
a function or coroutine (`sys.monitoring` PY_START), not each resumption of a coroutine.
A curl client sends, through the explicit proxy, each kind of request in turn, N times, and
the counts are read before and after each batch (SIGUSR1 writes them) and divided by N:

- intercepted HTTPS, a new tunnel per request (CONNECT, ClientHello, the request);
- intercepted HTTPS, requests on one kept-alive tunnel (after its first);
- a passed-through TLS tunnel (served by the front when it is on);
- plain HTTP (absolute-form).

Reported per request: `hook calls` (calls of event handlers: functions named as mitmproxy
events in the addon folders, and the front's connection handler), `functions` (every call into sandgate's code),
`modules` (distinct modules with a call), and `decisions` (calls of the policy's one entry
point, `sandgate.policy.decide.decide`). The figures are counts, not times: they do not
depend on the machine's load, and the same script run on two commits compares their
request paths. Everything runs on loopback (127.0.0.1 and 127.0.0.2) and is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "tests"))

import yaml  # noqa: E402
from conftest import TOKEN, UPSTREAM_IP, tenant_yaml, write_gateway_files  # noqa: E402
from support import RecordingUpstream, TestPKI, wait_for_port  # noqa: E402

# The gateway process: a profiler counting calls into sandgate's code, dumped on SIGUSR1.
_PROFILED_GATEWAY = textwrap.dedent(
    """
    import json, signal, sys
    from collections import Counter
    from mitmproxy import hooks
    roots = tuple(sys.argv[1].split(","))
    out = sys.argv[2]
    calls = Counter()
    mon = sys.monitoring
    TOOL = mon.PROFILER_ID

    def started(code, offset):
        # PY_START: a function's (or coroutine's) first start, never a resumption.
        if not code.co_filename.startswith(roots):
            return mon.DISABLE  # never sandgate's: stop asking for this code object
        calls[(code.co_filename, code.co_name)] += 1

    def dump(signum, frame):
        # Hook names register as mitmproxy's modules are imported: read them now, not at start.
        events = {h.name for h in hooks.all_hooks.values()} | {"handle"}
        snapshot = [[f, n, c] for (f, n), c in calls.items()]
        with open(out, "w") as fh:
            json.dump({"calls": snapshot, "events": sorted(events)}, fh)

    signal.signal(signal.SIGUSR1, dump)
    mon.use_tool_id(TOOL, "sandgate-request-path")
    mon.register_callback(TOOL, mon.events.PY_START, started)
    mon.set_events(TOOL, mon.events.PY_START)
    from sandgate.proxy.cli.main import main
    sys.exit(main(sys.argv[3:]))
    """
)


class ProfiledGateway:
    """`sandgate run` under the call counter; `snapshot()` reads the counts so far."""

    def __init__(self, root: Path, config: Path, port: int) -> None:
        self.dump = root / "calls.json"
        roots = ",".join(str(REPO / d) + "/" for d in ("proxy", "policy", "brokers"))
        env = {**os.environ, "SANDGATE_WORKERS": "1"}
        self.log = open(root / "gateway.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PROFILED_GATEWAY, roots, str(self.dump), "run", "--config", str(config)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        wait_for_port("127.0.0.1", port, timeout=120)
        time.sleep(0.5)

    def snapshot(self) -> tuple[Counter[tuple[str, str]], frozenset[str]]:
        self.dump.unlink(missing_ok=True)
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not self.dump.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.05)  # the dump is one write; let it finish
        data = json.loads(self.dump.read_text())
        calls = Counter({(f, n): c for f, n, c in data["calls"]})
        return calls, frozenset(data["events"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def _curl(port: int, ca: Path, *urls: str) -> None:
    """One curl: several URLs of one host share one connection (one tunnel)."""
    proxy = f"http://sb1:{TOKEN}@127.0.0.1:{port}"
    args = ["curl", "-sS", "--fail", "--cacert", str(ca), "-x", proxy]
    for url in urls:
        args += [url, "-o", "/dev/null"]
    subprocess.run(args, check=True, timeout=60, capture_output=True)


# Where mitmproxy's event handlers (and the front's connection handler) live.
_HOOK_FOLDERS = ("/proxy/addons/", "/proxy/front/", "/proxy/mitm/", "/proxy/approvals/")


def per_request(delta: Counter[tuple[str, str]], events: frozenset[str], n: int) -> dict[str, Any]:
    hook_calls = {
        f"{Path(f).relative_to(REPO)}:{name}": round(c / n, 2)
        for (f, name), c in sorted(delta.items())
        if name in events and any(part in f for part in _HOOK_FOLDERS)
    }
    hooks = sum(hook_calls.values())
    decisions = sum(
        c for (f, name), c in delta.items() if name == "decide" and f.endswith("/policy/decide.py")
    )
    modules = {f for (f, _), c in delta.items() if c >= n}  # touched by every request
    return {
        "hook calls": round(hooks, 1),
        "functions": round(sum(delta.values()) / n, 1),
        "modules": len(modules),
        "decisions": round(decisions / n, 2),
        "module list": sorted(str(Path(m).relative_to(REPO)) for m in modules),
        "hook list": hook_calls,
    }


def run(requests: int) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pki = TestPKI(["api.test", "pass.test"], directory=root)
        with (
            RecordingUpstream(UPSTREAM_IP, tls=pki, name="https") as https,
            RecordingUpstream(UPSTREAM_IP, name="http") as http,
        ):
            allow: list[dict[str, Any]] = [
                {"id": "inspected", "hosts": ["api.test"], "ports": [https.port], "inspect": True},
                {"id": "passed", "hosts": ["pass.test"], "ports": [https.port]},
                {"id": "plain", "hosts": ["api.test"], "ports": [http.port]},
            ]
            config = {"log": {"level": "warning"}, "upstream": {"trusted_ca": str(pki.ca_file)}}
            path, port = write_gateway_files(
                root, {"t1.yaml": yaml.safe_dump(yaml.safe_load(tenant_yaml("t1", allow)))}, config=config
            )
            gateway = ProfiledGateway(root, path, port)
            ca = root / "state" / "ca" / "mitmproxy-ca-cert.pem"
            combined = root / "ca.pem"
            combined.write_text(ca.read_text() + pki.ca_file.read_text())
            inspected = f"https://api.test:{https.port}/x"
            kinds = {
                "intercepted HTTPS, new tunnel": lambda: _curl(port, combined, inspected),
                "intercepted HTTPS, kept-alive tunnel": None,
                "passed-through TLS tunnel": lambda: _curl(
                    port, combined, f"https://pass.test:{https.port}/x"
                ),
                "plain HTTP": lambda: _curl(port, combined, f"http://api.test:{http.port}/x"),
            }
            results: dict[str, dict[str, Any]] = {}
            try:
                for kind, send in kinds.items():
                    if send is None:
                        # 1 + N requests in one curl: subtract a run of 1 to count the N reused.
                        before, events = gateway.snapshot()
                        _curl(port, combined, inspected)
                        one, _ = gateway.snapshot()
                        _curl(port, combined, *[inspected] * (requests + 1))
                        after, _ = gateway.snapshot()
                        results[kind] = per_request((after - one) - (one - before), events, requests)
                        continue
                    send()  # warm-up: caches, first-use imports
                    before, events = gateway.snapshot()
                    for _ in range(requests):
                        send()
                    after, _ = gateway.snapshot()
                    results[kind] = per_request(after - before, events, requests)
            finally:
                gateway.stop()
            return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--json", action="store_true", help="print JSON (with each kind's module list)")
    a = p.parse_args()
    results = run(a.requests)
    if a.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    print("| request | hook calls | functions | modules | decisions |")
    print("|---|---:|---:|---:|---:|")
    for kind, r in results.items():
        print(f"| {kind} | {r['hook calls']} | {r['functions']} | {r['modules']} | {r['decisions']} |")


if __name__ == "__main__":
    main()
