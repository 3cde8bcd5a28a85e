"""Transparent-mode figures: transparent vs explicit proxy, the DNS listener, `sandgate jail`.

Needs root (network namespaces, nftables). One run, same machine, same load client
(bench/loadclient.py), same upstream (bench/upstream.py in its own namespace):

  .venv/bin/python bench/transparent.py [--duration 8] [--quick]

Rows: plain HTTP c10 through the explicit listener (client on the host) and through the
transparent listener (client in a guest namespace, no proxy settings); DNS listener
queries/s and latency (allowed name, answers cached by the gateway's resolver); wall time of
`sandgate jail -- true` using a running gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from support.netns import netns_lab  # noqa: E402
from support.ports import free_port, wait_for_port  # noqa: E402

PY = sys.executable
SANDGATE = str(Path(PY).with_name("sandgate"))
TOKEN = "bench-token-0123456789abcdef"


def _pinned(core: int, argv: list[str]) -> list[str]:
    return ["taskset", "-c", str(core), *argv] if shutil.which("taskset") else argv


def _load(argv_prefix: list[str], args: list[str]) -> dict[str, float]:
    out = subprocess.run(
        [*argv_prefix, *_pinned(1, [PY, str(REPO / "bench" / "loadclient.py"), *args])],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    return json.loads(out)


async def _dns_load(server: str, name: str, seconds: float, concurrency: int) -> tuple[float, float, float]:
    import dns.message

    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setblocking(False)
        await loop.sock_connect(sock, (server, 53))
        wire = dns.message.make_query(name, "A").to_wire()
        while time.monotonic() < deadline:
            start = time.perf_counter()
            await loop.sock_sendall(sock, wire)
            await asyncio.wait_for(loop.sock_recv(sock, 512), 2)
            latencies.append((time.perf_counter() - start) * 1000)
        sock.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    latencies.sort()
    return len(latencies) / seconds, latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]


DNS_CLIENT = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[4])
from transparent import _dns_load
print(json.dumps(asyncio.run(_dns_load(sys.argv[1], sys.argv[2], float(sys.argv[3]), 10))))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    duration = 3.0 if a.quick else a.duration
    if os.geteuid() != 0:
        print("bench/transparent.py needs root", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="sandgate-bench-"))
    rows: list[tuple[str, str]] = []
    with netns_lab() as lab:
        up, guest = lab.add("bup"), lab.add("bg")
        upstream = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                up.name,
                *_pinned(1, [PY, str(REPO / "bench" / "upstream.py"), "--host", up.addr]),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert upstream.stdout is not None
            http_port = json.loads(upstream.stdout.readline())["http_port"]
            (root / "rules" / "tenants").mkdir(parents=True)
            digest = hashlib.sha256(TOKEN.encode()).hexdigest()
            (root / "rules" / "tenants" / "t.yaml").write_text(
                yaml.safe_dump(
                    {
                        "tenant": "t",
                        "sandboxes": [{"id": "sb", "token": f"sha256:{digest}"}],
                        "allow": [{"hosts": ["web.test"], "ports": [http_port]}],
                    }
                )
            )
            explicit, transparent, dns_port = free_port(), free_port(), free_port()
            config = root / "sandgate.yaml"
            config.write_text(
                yaml.safe_dump(
                    {
                        "listeners": [
                            {"host": "127.0.0.1", "port": explicit},
                            {"mode": "transparent", "host": "0.0.0.0", "port": transparent},
                        ],
                        "dns": {"host": "0.0.0.0", "port": dns_port},
                        "rules_dir": str(root / "rules"),
                        "state_dir": str(root / "state"),
                        "resolver": {"hosts": {"web.test": [up.addr]}},
                        "address_guard": {"reachable_by_name": [f"10.200.{lab.subnet}.0/24"]},
                        "log": {"level": "warning"},
                        "reload": {"watch": True, "interval_seconds": 0.2},
                        "host_rules": {"table": f"sgbench_{lab.tag}"},
                    }
                )
            )
            with (root / "gateway.log").open("wb") as log:
                gateway = subprocess.Popen(
                    _pinned(0, [SANDGATE, "run", "--config", str(config)]),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            try:
                wait_for_port("127.0.0.1", explicit, timeout=30)
                subprocess.run(
                    [
                        SANDGATE,
                        "sandbox",
                        "add",
                        "--interface",
                        guest.host_if,
                        "--address",
                        guest.addr,
                        "--tenant",
                        "t",
                        "--id",
                        "bench-guest",
                        "--config",
                        str(config),
                    ],
                    check=True,
                    capture_output=True,
                )
                time.sleep(1.0)
                url = f"http://web.test:{http_port}/"
                ex = _load(
                    [],
                    [
                        "--address",
                        f"127.0.0.1:{explicit}",
                        "--url",
                        url,
                        "--proxy",
                        "--auth",
                        f"sb:{TOKEN}",
                        "--concurrency",
                        "10",
                        "--duration",
                        str(duration),
                    ],
                )
                tr = _load(
                    ["ip", "netns", "exec", guest.name],
                    [
                        "--address",
                        f"{up.addr}:{http_port}",
                        "--url",
                        url,
                        "--concurrency",
                        "10",
                        "--duration",
                        str(duration),
                    ],
                )
                rows.append(
                    (
                        "explicit proxy, plain HTTP c10",
                        f"{ex['rps']:.0f} req/s, p50 {ex['p50_ms']:.1f} ms, p99 {ex['p99_ms']:.1f} ms, errors {ex['errors']}",
                    )
                )
                rows.append(
                    (
                        "transparent, plain HTTP c10 (guest namespace)",
                        f"{tr['rps']:.0f} req/s, p50 {tr['p50_ms']:.1f} ms, p99 {tr['p99_ms']:.1f} ms, errors {tr['errors']}",
                    )
                )
                rows.append(("transparent / explicit", f"{tr['rps'] / ex['rps']:.2f}"))
                dns_out = subprocess.run(
                    [
                        "ip",
                        "netns",
                        "exec",
                        guest.name,
                        PY,
                        "-c",
                        DNS_CLIENT,
                        guest.host_addr,
                        "web.test",
                        str(duration),
                        str(REPO / "bench"),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                if dns_out.returncode != 0:
                    raise RuntimeError(dns_out.stderr)
                qps, p50, p99 = json.loads(dns_out.stdout)
                rows.append(
                    (
                        "DNS listener, allowed name, 10 concurrent",
                        f"{qps:.0f} queries/s, p50 {p50:.2f} ms, p99 {p99:.2f} ms",
                    )
                )
                times = []
                for _ in range(3 if a.quick else 5):
                    start = time.perf_counter()
                    subprocess.run(
                        [SANDGATE, "jail", "--config", str(config), "--tenant", "t", "--", "true"],
                        check=True,
                        capture_output=True,
                    )
                    times.append(time.perf_counter() - start)
                rows.append(
                    (
                        "`sandgate jail -- true`, running gateway",
                        f"median {statistics.median(times) * 1000:.0f} ms (min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f})",
                    )
                )
            finally:
                subprocess.run(
                    [SANDGATE, "sandbox", "remove", "bench-guest", "--config", str(config)],
                    capture_output=True,
                )
                gateway.terminate()
                gateway.wait(20)
        finally:
            upstream.terminate()
            upstream.wait(10)
    shutil.rmtree(root, ignore_errors=True)
    print("| transparent-mode row | result |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
