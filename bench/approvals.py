"""Approvals: what `ask` rules cost requests that do not hit them, and approve → release latency.

Run: `.venv/bin/python bench/approvals.py [--quick] [--workers 1,2] [--markdown out.md]`.

(a) The cost of `ask` rules on requests they do not match. `decide()` per request (as
bench/matcher.py times it: cached resolution, driven without the event loop) for one tenant
with 10 allow rules and 0, 10 or 100 `ask` rules on other hosts; two request kinds: allowed by
an allow rule (ask rules are never looked at) and denied, no rule matching (the ask index is
searched before the denial). Policies are timed in interleaved rounds, so drift on a busy
machine falls on each alike. Then through a real gateway: plain HTTP via the proxy, c10, with
0 vs 100 ask rules, interleaved A/B rounds (bench/loadclient.py, bench/upstream.py).

(b) Approve → release: a real gateway (`sandgate run`) holds many requests (raw HTTP/1.1 via
the proxy, one connection each) against a loopback upstream that notes when each request
arrives (CLOCK_MONOTONIC, the same clock in every process); each is approved through the admin
API (its unix socket), one at a time, and the latency is from just before the approve call to
the upstream receiving the request. With `--workers 2`, the lead takes approvals to the worker
holding the request (its private socket): that row includes the hop.

Everything stays on loopback; every process and temporary folder is removed on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests"))

import httpx  # noqa: E402
import yaml  # noqa: E402
from conftest import SANDGATE, TOKEN, TOKEN_REF, UPSTREAM_IP, write_gateway_files  # noqa: E402
from matcher import _timer_cost, run_sync  # noqa: E402
from support import wait_for_port  # noqa: E402

from sandgate.policy.address_guard import AddressGuard  # noqa: E402
from sandgate.policy.decide import decide  # noqa: E402
from sandgate.policy.decision import EgressRequest, Identity, Phase  # noqa: E402
from sandgate.policy.model.loader import load_policy_dir  # noqa: E402
from sandgate.policy.model.policyset import PolicySet  # noqa: E402
from sandgate.policy.reasons import Reason  # noqa: E402
from sandgate.policy.resolver import CachingResolver, StaticResolver  # noqa: E402

ASK_COUNTS = (0, 10, 100)
IDENTITY = Identity("t1", "sb1")


# -- (a) decide() with and without ask rules ------------------------------------------------


def tenant_doc(asks: int, port: int = 443) -> dict[str, Any]:
    """Tenant t1: 10 allow rules (api0..9.test), and `asks` ask rules on hosts nobody requests
    (half exact names, half wildcard suffixes, some with methods and paths)."""
    doc: dict[str, Any] = {
        "tenant": "t1",
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
        "allow": [{"id": f"a{i}", "hosts": [f"api{i}.test"], "ports": [port]} for i in range(10)],
    }
    if port != 443:
        doc["allow"].append({"id": "api", "hosts": ["api.test"], "ports": [port]})
    if asks:
        doc["ask"] = [
            {
                "id": f"q{i}",
                "hosts": [f"ask{i}.test" if i % 2 else f"*.askzone{i}.test"],
                "ports": [443, port],
            }
            | ({"methods": ["POST"], "paths": ["/v1/**"]} if i % 3 == 0 else {})
            for i in range(asks)
        ]
    return doc


def load(asks: int, root: Path) -> PolicySet:
    (root / "tenants").mkdir(parents=True)
    (root / "tenants" / "t1.yaml").write_text(yaml.safe_dump(tenant_doc(asks), sort_keys=False))
    return load_policy_dir(root)


def decide_costs(decisions: int, rounds: int) -> list[dict[str, Any]]:
    """p50 / p99 / mean µs of decide() per (ask rules, request kind), rounds interleaved."""
    allowed = [EgressRequest(Phase.REQUEST, f"api{i % 10}.test", 443, scheme="https", method="GET", path="/x")
               for i in range(decisions)]  # fmt: skip
    denied = [EgressRequest(Phase.REQUEST, f"nobody{i % 50}.test", 443, scheme="https", method="GET", path="/x")
              for i in range(decisions)]  # fmt: skip
    resolver = CachingResolver(StaticResolver({f"api{i}.test": ["127.0.0.2"] for i in range(10)}))
    guard = AddressGuard(["127.0.0.0/8"], ["127.0.0.1"])
    samples: dict[tuple[int, str], list[int]] = {}
    with tempfile.TemporaryDirectory(prefix="sgbench-approvals-") as tmp:
        policies = {n: load(n, Path(tmp) / f"rules-{n}") for n in ASK_COUNTS}

        async def warm() -> None:
            for policy in policies.values():
                for r in allowed[:20] + denied[:60]:
                    await decide(policy, IDENTITY, r, resolver, guard)

        asyncio.run(warm())
        clock = time.perf_counter_ns
        for _ in range(rounds):
            for n, policy in policies.items():
                for kind, requests, expect in (
                    ("allowed", allowed, Reason.ALLOWED),
                    ("denied", denied, Reason.HOST_NOT_ALLOWED),
                ):
                    out = samples.setdefault((n, kind), [])
                    gc.collect()
                    for r in requests:
                        t0 = clock()
                        d = run_sync(decide(policy, IDENTITY, r, resolver, guard))
                        out.append(clock() - t0)
                        if d.reason is not expect:
                            raise AssertionError(
                                f"{r.host} with {n} ask rules: {d.reason}, expected {expect}"
                            )
    rows = []
    for (n, kind), values in sorted(samples.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        s = sorted(values)
        rows.append(
            {
                "ask_rules": n,
                "kind": kind,
                "decisions": len(s),
                "p50_us": round(s[len(s) // 2] / 1000, 2),
                "p99_us": round(s[int(len(s) * 0.99)] / 1000, 2),
                "mean_us": round(sum(s) / len(s) / 1000, 2),
            }
        )
    return rows


# -- the gateway, the upstreams -------------------------------------------------------------


@contextlib.contextmanager
def process(args: list[str], **kwargs: Any) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(args, text=True, **kwargs)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@contextlib.contextmanager
def gateway(
    root: Path, tenant: dict[str, Any], workers: int, extra: dict[str, Any] | None = None
) -> Iterator[int]:
    """`sandgate run` with this tenant; yields its proxy port once it serves."""
    config = {"log": {"level": "warning"}, "workers": {"count": workers}, **(extra or {})}
    path, port = write_gateway_files(
        root, {"t1.yaml": yaml.safe_dump(tenant, sort_keys=False)}, config=config
    )
    with open(root / "gateway.log", "wb") as log, process([SANDGATE, "run", "--config", str(path)], stdout=log,
                                                          stderr=subprocess.STDOUT):  # fmt: skip
        wait_for_port("127.0.0.1", port, timeout=120)
        status = root / "state" / "gateway.json"
        deadline = time.monotonic() + 120
        while workers > 1 and not status.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start: {(root / 'gateway.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield port


@contextlib.contextmanager
def fast_upstream() -> Iterator[int]:
    """bench/upstream.py on 127.0.0.2: its plain HTTP port."""
    with process([sys.executable, str(BENCH / "upstream.py"), "--host", UPSTREAM_IP], stdin=subprocess.PIPE,
                 stdout=subprocess.PIPE) as proc:  # fmt: skip
        assert proc.stdout is not None
        yield int(json.loads(proc.stdout.readline())["http_port"])


def gateway_rps(root: Path, asks: int, duration: float, rounds: int, workers: int) -> list[dict[str, Any]]:
    """Plain HTTP c10 through a gateway whose tenant has 0 vs `asks` ask rules (A/B rounds)."""
    results: dict[int, list[dict[str, Any]]] = {0: [], asks: []}
    with fast_upstream() as up:
        for r in range(rounds):
            for n in (0, asks) if r % 2 == 0 else (asks, 0):
                with gateway(root / f"rps-{n}-{r}", tenant_doc(n, up), workers) as port:
                    out = subprocess.run(
                        [
                            sys.executable, str(BENCH / "loadclient.py"),
                            "--address", f"127.0.0.1:{port}", "--url", f"http://api.test:{up}/x",
                            "--proxy", "--auth", f"sb1:{TOKEN}", "--concurrency", "10",
                            "--duration", str(duration), "--warmup", "1",
                        ],
                        capture_output=True, text=True, timeout=duration + 120, check=True,
                    )  # fmt: skip
                    result = json.loads(out.stdout)
                    if result["errors"] or set(result["statuses"]) != {"200"}:
                        raise AssertionError(f"gateway row with {n} ask rules: {result}")
                    results[n].append(result)
    return [
        {
            "ask_rules": n,
            "rounds": len(rs),
            "rps": round(statistics.median(r["rps"] for r in rs)),
            "rps_each": [round(r["rps"]) for r in rs],
            "p50_ms": round(statistics.median(r["p50_ms"] for r in rs), 2),
            "p99_ms": round(statistics.median(r["p99_ms"] for r in rs), 2),
        }
        for n, rs in results.items()
    ]


# -- (b) approve -> release -----------------------------------------------------------------

ARRIVAL_UPSTREAM = r"""
import asyncio, sys, time
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            t = time.monotonic_ns()
            target = head.split(b" ", 2)[1].decode()
            sys.stdout.write(f"{target} {t}\n"); sys.stdout.flush()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(handle, sys.argv[1], 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
"""


class Arrivals:
    """An upstream (its own process) that reports each request's target and arrival time."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.port = int(proc.stdout.readline())
        self.seen: dict[str, int] = {}

    async def arrival(self, target: str, within: float = 30.0) -> int:
        """The monotonic ns at which `target` reached the upstream."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while target not in self.seen:
            assert self.proc.stdout is not None
            line = await asyncio.wait_for(
                loop.run_in_executor(None, self.proc.stdout.readline), max(0.0, deadline - loop.time())
            )
            if not line:
                raise RuntimeError("the upstream exited")
            seen_target, ns = line.split()
            self.seen[seen_target] = int(ns)
        return self.seen[target]


async def held_request(
    port: int, upstream: int, target: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw HTTP/1.1 request through the proxy (left waiting for its answer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    writer.write(
        f"GET http://api.test:{upstream}{target} HTTP/1.1\r\nHost: api.test:{upstream}\r\n"
        f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
    )
    await writer.drain()
    return reader, writer


async def release_latencies(
    port: int, admin_socket: Path, arrivals: Arrivals, count: int, batch: int
) -> dict[str, Any]:
    """Hold `count` requests (`batch` at a time), approve each, time approve -> upstream."""
    latencies: list[float] = []
    answers: list[float] = []
    transport = httpx.AsyncHTTPTransport(uds=str(admin_socket))
    async with httpx.AsyncClient(transport=transport, base_url="http://sandgate", timeout=30) as admin:
        done = 0
        while done < count:
            n = min(batch, count - done)
            targets = [f"/held/{done + i}" for i in range(n)]
            conns = [await held_request(port, arrivals.port, t) for t in targets]
            ids: dict[str, str] = {}
            deadline = time.monotonic() + 60
            while len(ids) < n:
                listed = (await admin.get("/v1/access-requests")).json()["requests"]
                ids = {r["path"]: r["id"] for r in listed if r["state"] == "held" and r["path"] in targets}
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {len(ids)} of {n} requests held")
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # every hold settled: nothing else runs while one is timed
            for target in targets:
                t0 = time.monotonic_ns()
                answer = await admin.post(f"/v1/access-requests/{ids[target]}/approve", json={"by": "bench"})
                t1 = time.monotonic_ns()
                if answer.status_code != 200:
                    raise RuntimeError(f"approve {target}: {answer.status_code} {answer.text}")
                arrived = await arrivals.arrival(target)
                latencies.append((arrived - t0) / 1e6)
                answers.append((t1 - t0) / 1e6)
            for reader, writer in conns:
                status = await asyncio.wait_for(reader.readline(), 30)
                if b" 200 " not in status:
                    raise RuntimeError(f"a released request was answered {status!r}")
                writer.close()
            done += n
    return {
        "requests": len(latencies),
        **_percentiles("release", latencies),
        **_percentiles("answer", answers),
    }


def _percentiles(name: str, values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {
        f"{name}_p50_ms": round(s[len(s) // 2], 2),
        f"{name}_p99_ms": round(s[min(len(s) - 1, int(len(s) * 0.99))], 2),
        f"{name}_max_ms": round(s[-1], 2),
    }


def release_row(root: Path, workers: int, count: int, batch: int) -> dict[str, Any]:
    with process([sys.executable, "-c", ARRIVAL_UPSTREAM, UPSTREAM_IP], stdin=subprocess.PIPE,
                 stdout=subprocess.PIPE) as proc:  # fmt: skip
        arrivals = Arrivals(proc)
        tenant = {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
            "ask": [{"id": "api", "hosts": ["api.test"], "ports": [arrivals.port]}],
        }
        extra = {"approvals": {"ask_timeout_seconds": 600, "max_held_per_sandbox": 10_000}}
        with gateway(root / f"release-w{workers}", tenant, workers, extra) as port:
            admin_socket = root / f"release-w{workers}" / "state" / "admin.sock"
            result = asyncio.run(release_latencies(port, admin_socket, arrivals, count, batch))
    return {"workers": workers, **result}


# -- report ---------------------------------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Approvals benchmark, {report['when']}, load average at start {report['loadavg']}"
        " (a shared, busy 2-core machine: figures vary ±10-30 % between runs).",
        "",
        "(a) `decide()` per request, tenant with 10 allow rules, ask rules on other hosts "
        f"(timer ~{report['timer_ns']} ns included):",
        "",
        "| request | ask rules | decisions | p50 µs | p99 µs | mean µs |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in report["decide"]:
        lines.append(
            f"| {r['kind']} | {r['ask_rules']} | {r['decisions']:,} | {r['p50_us']:.2f} | "
            f"{r['p99_us']:.2f} | {r['mean_us']:.2f} |"
        )
    if report.get("gateway"):
        lines += [
            "",
            "Through a gateway (plain HTTP via the proxy, c10, allowed requests, median of rounds):",
            "",
            "| ask rules | rounds | req/s (each) | p50 ms | p99 ms |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in report["gateway"]:
            each = ", ".join(f"{x:,}" for x in r["rps_each"])
            lines.append(
                f"| {r['ask_rules']} | {r['rounds']} | {r['rps']:,} ({each}) | {r['p50_ms']} | {r['p99_ms']} |"
            )
    lines += [
        "",
        "(b) Approve → release: admin API approve call to the upstream receiving the request:",
        "",
        "| workers | requests | release p50 / p99 / max ms | approve answered p50 / p99 ms |",
        "|---:|---:|---:|---:|",
    ]
    for r in report["release"]:
        lines.append(
            f"| {r['workers']} | {r['requests']} | {r['release_p50_ms']} / {r['release_p99_ms']} / "
            f"{r['release_max_ms']} | {r['answer_p50_ms']} / {r['answer_p99_ms']} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer decisions, rounds and requests")
    p.add_argument("--decisions", type=int, default=20_000)
    p.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds for decide() (and 2x for the gateway)"
    )
    p.add_argument("--duration", type=float, default=5.0, help="seconds per gateway load")
    p.add_argument("--no-gateway-rps", action="store_true", help="skip the gateway req/s rows")
    p.add_argument("--requests", type=int, default=300, help="held requests approved per release row")
    p.add_argument("--batch", type=int, default=100, help="requests held at once")
    p.add_argument("--workers", default="1,2", help="release rows: worker counts")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    a = p.parse_args()
    if a.quick:
        a.decisions, a.rounds, a.duration, a.requests = 5_000, 2, 2.0, 100
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "timer_ns": _timer_cost(),
        "decide": decide_costs(a.decisions, a.rounds),
    }
    with tempfile.TemporaryDirectory(prefix="sgbench-approvals-") as tmp:
        root = Path(tmp)
        if not a.no_gateway_rps:
            report["gateway"] = gateway_rps(root, 100, a.duration, 2 * a.rounds, 1)
        report["release"] = [release_row(root, int(w), a.requests, a.batch) for w in a.workers.split(",")]
    text = markdown(report)
    print(text)
    if a.json:
        a.json.write_text(json.dumps(report, indent=2) + "\n")
    if a.markdown:
        a.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
