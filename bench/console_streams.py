"""What open console pages cost the gateway: decisions with 0 and with N live streams open.

Run: `.venv/bin/python bench/console_streams.py [--streams 20] [--rounds 5] [--seconds 8] [--json F]`.

One gateway (one process, the console on its admin TCP listener) in front of bench/upstream.py.
Rounds alternate two rows: no console page open, then N live-decision streams open (each an
SSE client logged in with its own session, reading every record the gateway writes: what N
browsers left open on the live decisions page do). Each round is bench/loadclient.py through the
proxy, plain HTTP, keep-alive, 10 connections, S seconds after a 1 s warm-up. Reported: each
row's median req/s, p50 and p99 latency and the gateway's CPU time per request over the
rounds (every round's rate alongside), and how many events the streams received. The streams
are read by threads of this process, which shares the 2 cores with the gateway, the upstream
and the load client: what the figures show is the gateway's cost plus that load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from audit_sinks import load, upstream  # noqa: E402
from support.ports import free_port, wait_for_port  # noqa: E402

SANDGATE = str(Path(sys.executable).with_name("sandgate"))
TOKEN = "bench-token-0123456789abcdef"  # the bench sandbox's proxy token
ADMIN_TOKEN = "bench-admin-token-0123456789abcdef"


def gateway(folder: Path, up_port: int) -> tuple[subprocess.Popen[bytes], int, int]:
    """The gateway with its console on; (process, proxy port, admin port) once both listen."""
    (folder / "rules" / "tenants").mkdir(parents=True)
    (folder / "rules" / "tenants" / "t1.yaml").write_text(
        yaml.safe_dump(
            {
                "tenant": "t1",
                "sandboxes": [{"id": "sb1", "token": "env:BENCH_TOKEN"}],
                "allow": [{"hosts": ["api.test"], "ports": [up_port]}],
            }
        )
    )
    token_file = folder / "admin.token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    token_file.chmod(0o600)
    port, admin_port = free_port(), free_port()
    config = {
        "listeners": [{"host": "127.0.0.1", "port": port}],
        "rules_dir": str(folder / "rules"),
        "state_dir": str(folder / "state"),
        "resolver": {"hosts": {"api.test": ["127.0.0.2"]}},
        "address_guard": {"reachable_by_name": ["127.0.0.0/8"]},
        "log": {"level": "warning", "format": "json"},
        "workers": {"count": 1},
        "admin": {"listen": f"127.0.0.1:{admin_port}", "token": f"file:{token_file}"},
        "console": {"enabled": True, "max_stream_clients": 100},
    }
    (folder / "sandgate.yaml").write_text(yaml.safe_dump(config))
    with (folder / "gateway.log").open("wb") as log:
        proc = subprocess.Popen(
            [SANDGATE, "run", "--config", str(folder / "sandgate.yaml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "BENCH_TOKEN": TOKEN},
        )
    wait_for_port("127.0.0.1", port, timeout=60)
    wait_for_port("127.0.0.1", admin_port, timeout=60)
    return proc, port, admin_port


class Streams:
    """N logged-in clients reading the live decisions stream, each on a thread of its own."""

    def __init__(self, admin_port: int, count: int) -> None:
        self.base = f"http://127.0.0.1:{admin_port}"
        self.count = count
        self.events = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._clients: list[httpx.Client] = []
        self._threads: list[threading.Thread] = []

    def open(self) -> None:
        self._stop.clear()
        ready = threading.Barrier(self.count + 1, timeout=30)
        for _ in range(self.count):
            client = httpx.Client(base_url=self.base, timeout=httpx.Timeout(10, read=None))
            answer = client.post("/console/login", data={"token": ADMIN_TOKEN})
            assert answer.status_code == 303, answer.text
            self._clients.append(client)
            thread = threading.Thread(target=self._read, args=(client, ready), daemon=True)
            thread.start()
            self._threads.append(thread)
        ready.wait()

    def _read(self, client: httpx.Client, ready: threading.Barrier) -> None:
        try:
            with client.stream("GET", "/console/decisions/stream") as answer:
                ready.wait()
                for line in answer.iter_lines():
                    if self._stop.is_set():
                        return
                    if line.startswith("data:"):
                        with self._lock:
                            self.events += 1
        except (httpx.HTTPError, threading.BrokenBarrierError):
            return  # closed at the end of the round

    def close(self) -> None:
        self._stop.set()
        for client in self._clients:
            client.close()
        for thread in self._threads:
            thread.join(5)
        self._clients, self._threads = [], []


def report(rows: dict[str, list[dict[str, Any]]], events: int) -> str:
    def med(row: str, key: str) -> float:
        return statistics.median(float(r[key]) for r in rows[row])

    names = list(rows)
    base = med(names[0], "rps")
    lines = [
        f"{'row':<18} {'req/s':>7} {'ratio':>6} {'p50 ms':>7} {'p99 ms':>7} {'CPU µs/req':>11}  each round"
    ]
    for row in names:
        each = " ".join(f"{r['rps']:.0f}" for r in rows[row])
        lines.append(
            f"{row:<18} {med(row, 'rps'):>7.0f} {med(row, 'rps') / base:>6.2f} {med(row, 'p50_ms'):>7.1f}"
            f" {med(row, 'p99_ms'):>7.1f} {med(row, 'cpu_us_per_request'):>11.0f}  {each}"
        )
    lines.append(f"events the streams received: {events}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--json")
    args = p.parse_args()
    rows: dict[str, list[dict[str, Any]]] = {"no page open": [], f"{args.streams} streams open": []}
    with tempfile.TemporaryDirectory(prefix="sandgate-bench-console-") as tmp:
        root = Path(tmp)
        up, up_port = upstream(root)
        proc, port, admin_port = gateway(root / "gw", up_port)
        streams = Streams(admin_port, args.streams)
        try:
            for r in range(args.rounds):
                for row in rows:
                    if row != "no page open":
                        streams.open()
                    try:
                        got = load(proc.pid, port, up_port, args.seconds)
                    finally:
                        streams.close()
                    rows[row].append(got)
                    print(f"round {r + 1} {row}: {got['rps']:.0f} req/s", file=sys.stderr, flush=True)
            print(report(rows, streams.events))
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1))
        finally:
            proc.terminate()
            proc.wait(30)
            up.terminate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
