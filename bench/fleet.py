"""Fleet-mode figures: req/s with a redis registry vs static tenant files, redis round trips per
request on the hot path, and how long one published reload takes to be in force on two gateways.

Run: `.venv/bin/python bench/fleet.py [--duration 4] [--requests 2000] [--reloads 10]`.
Everything is on loopback: a redis-server, bench/upstream.py on 127.0.0.2, `sandgate run`
gateways on 127.0.0.1, bench/loadclient.py (plain HTTP through the proxy, c10). Prints one
JSON object. Not pinned to cores (bench/run.py does that): figures are ±20 % on a shared box.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "tests"))
from support import RedisServer, free_port, wait_for_port  # noqa: E402

from sandgate.proxy.config import RedisConfig  # noqa: E402
from sandgate.proxy.fleet.channel import publish_reload  # noqa: E402

SANDGATE = str(Path(sys.executable).with_name("sandgate"))
UPSTREAM_IP = "127.0.0.2"
TOKEN = "bench-token-0123456789abcdef"
DIGEST = "sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()


def tenant(allow_host: str, port: int) -> str:
    allow = [{"hosts": [allow_host], "ports": [port]}]
    return yaml.safe_dump({"tenant": "t1", "sandboxes": [{"id": "sb1", "token": DIGEST}], "allow": allow})


def start_gateway(
    root: Path, redis_url: str | None, upstream_port: int
) -> tuple[subprocess.Popen[bytes], int]:
    (root / "rules" / "tenants").mkdir(parents=True)
    (root / "rules" / "tenants" / "t1.yaml").write_text(tenant("api.test", upstream_port))
    port = free_port()
    cfg: dict[str, Any] = {
        "listeners": [{"host": "127.0.0.1", "port": port}],
        "rules_dir": str(root / "rules"),
        "state_dir": str(root / "state"),
        "resolver": {"hosts": {"api.test": [UPSTREAM_IP], "open.test": [UPSTREAM_IP]}},
        "address_guard": {"reachable_by_name": ["127.0.0.0/8"]},
        "log": {"level": "warning"},
        "reload": {"watch": False},
    }
    if redis_url:
        cfg["redis"] = {"url": redis_url, "prefix": "bench:", "gateway_id": root.name}
    (root / "sandgate.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([SANDGATE, "run", "--config", str(root / "sandgate.yaml")], cwd=root)
    wait_for_port("127.0.0.1", port, timeout=30)
    return proc, port


def load(port: int, upstream_port: int, user: str, args: argparse.Namespace, *, requests: int = 0) -> Any:
    argv = [sys.executable, str(BENCH / "loadclient.py"), "--address", f"127.0.0.1:{port}", "--proxy",
            "--url", f"http://api.test:{upstream_port}/x", "--auth", f"{user}:{TOKEN}",
            "--concurrency", "10", "--duration", str(args.duration), "--warmup", "1"]  # fmt: skip
    if requests:
        argv += ["--requests", str(requests)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def redis_stats(url: str) -> dict[str, int]:
    """Calls per command so far (commands a Lua script runs count too)."""
    out = subprocess.run(["redis-cli", "-u", url, "INFO", "commandstats"], capture_output=True, text=True)
    return {
        line.split(":")[0].removeprefix("cmdstat_"): int(line.split("calls=")[1].split(",")[0])
        for line in out.stdout.splitlines()
        if "calls=" in line
    }


def redis_calls(url: str) -> int:
    return sum(redis_stats(url).values())


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def status(port: int, upstream_port: int) -> int:
    with httpx.Client(proxy=f"http://sb1:{TOKEN}@127.0.0.1:{port}", timeout=5) as c:
        return c.get(f"http://api.test:{upstream_port}/x").status_code


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--reloads", type=int, default=10)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sandgate-fleet-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    redis = RedisServer(tmp / "redis").start()
    try:
        up = subprocess.Popen([sys.executable, str(BENCH / "upstream.py"), "--host", UPSTREAM_IP],
                              stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)  # fmt: skip
        procs.append(up)  # type: ignore[arg-type]
        assert up.stdout is not None
        upstream_port = int(json.loads(up.stdout.readline())["http_port"])
        static, static_port = start_gateway(tmp / "static", None, upstream_port)
        fleet_a, port_a = start_gateway(tmp / "gw-a", redis.url, upstream_port)
        fleet_b, port_b = start_gateway(tmp / "gw-b", redis.url, upstream_port)
        procs += [static, fleet_a, fleet_b]
        env = {**os.environ, "BENCH_TOKEN": TOKEN}
        subprocess.run([SANDGATE, "sandbox", "add", "--config", str(tmp / "gw-a" / "sandgate.yaml"), "--tenant",
                        "t1", "--id", "dyn1", "--token", "env:BENCH_TOKEN"], check=True, env=env, cwd=tmp)  # fmt: skip
        deadline = time.monotonic() + 10
        while (code := subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-x",
                              f"http://dyn1:{TOKEN}@127.0.0.1:{port_a}", f"http://api.test:{upstream_port}/x"],
                             capture_output=True, text=True).stdout) != "200":  # fmt: skip
            assert time.monotonic() < deadline, f"dyn1 never served on {port_a}: {code}"
            time.sleep(0.05)
        result: dict[str, Any] = {}
        result["static_rps"] = load(static_port, upstream_port, "sb1", args)["rps"]
        result["redis_registry_rps"] = load(port_a, upstream_port, "dyn1", args)["rps"]
        # Round trips: every command redis counted during a burst, minus what an idle window of
        # the same length costs (each gateway checks the fleet version once a second).
        stats_before = redis_stats(redis.url)
        before, t0 = sum(stats_before.values()), time.monotonic()
        burst = load(port_a, upstream_port, "dyn1", args, requests=args.requests)
        stats_after = redis_stats(redis.url)
        during, window = sum(stats_after.values()) - before - 1, time.monotonic() - t0
        before = redis_calls(redis.url)
        time.sleep(window)
        idle = redis_calls(redis.url) - before - 1
        result["hot_path"] = {
            "requests": burst.get("count", args.requests),
            "redis_commands_during_burst": during,
            "redis_commands_idle_same_window": idle,
            "commands_per_request": round(max(0, during - idle) / max(1, args.requests), 4),
            # Which commands: the audit writer's batches (evalsha, and inside each script a
            # set + xadd per record), the limit sync's incrby/expire, the version checks.
            "by_command": delta(stats_after, stats_before),
        }
        # Reload: flip both tenant files, publish once, time until both enforce the change.
        latencies = []
        for i in range(args.reloads):
            host, want = ("open.test", 403) if i % 2 == 0 else ("api.test", 200)
            for name in ("gw-a", "gw-b"):
                (tmp / name / "rules" / "tenants" / "t1.yaml").write_text(tenant(host, upstream_port))
            started = time.monotonic()
            asyncio.run(publish_reload(RedisConfig(url=redis.url, prefix="bench:")))
            pending = {port_a, port_b}
            while pending:
                pending = {p for p in pending if status(p, upstream_port) != want}
                assert time.monotonic() - started < 10, "reload never arrived"
            latencies.append(time.monotonic() - started)
        result["reload_to_both_ms"] = {
            "median": round(statistics.median(latencies) * 1000, 1),
            "max": round(max(latencies) * 1000, 1),
            "runs": len(latencies),
        }
        print(json.dumps(result, indent=2))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(15)
        redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
