"""The gateway's request rate with SIEM sinks: none, all four up, all four down.

Run: `.venv/bin/python bench/audit_sinks.py [--rounds R] [--seconds S] [--json out.json]`.

Three gateways (`sandgate run`, one process each, or `--workers N`: N workers under a
supervisor, which then runs the sinks) serve the same tenant in front of
bench/upstream.py; the second and third have all four sinks (syslog over TLS to Debian's
rsyslogd, OTLP/HTTP, HEC and bulk to the tests' local receivers, tests/support/), OCSF for
OTLP and bulk, native for syslog and HEC. The second's receivers are up; the third's are
never started (connections refused: its sinks queue every record on disk and retry with
backoff). Rounds interleave the three rows (none, up, down, none, up, down, ...) so a drift
of the machine reaches each row alike; each round is bench/loadclient.py through the proxy,
plain HTTP, keep-alive, 10 connections, S seconds after a 1 s warm-up. Reported: each row's
median req/s and p50 latency over R rounds (every round's figure alongside), and each row's
rate as a ratio of the row without sinks, and the gateway process's CPU time per request
(user + system, all its threads, from /proc: what the sinks cost the processes that decide,
less sensitive than the rate to what else the 2 cores run) and, with workers, the
CPU time per request of the process that delivers (the supervisor with workers, else the
gateway's courier child). One machine, 2 shared cores: the receivers, the
upstream and the load client share them with the gateway, noisy (±10%).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.ports import free_port, wait_for_port  # noqa: E402
from support.siem_gateway import Receivers  # noqa: E402

SANDGATE = str(Path(sys.executable).with_name("sandgate"))
TOKEN = "bench-token-0123456789abcdef"  # the bench sandbox's proxy token
ROWS = ("no sinks", "4 sinks up", "4 sinks down")


def upstream(folder: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "upstream.py"), "--host", "127.0.0.2"],
        stdin=subprocess.PIPE,  # kept open: the upstream stops when its stdin closes
        stdout=subprocess.PIPE,
        text=True,
        cwd=folder,
    )
    assert proc.stdout is not None
    return proc, int(json.loads(proc.stdout.readline())["http_port"])


def gateway(
    folder: Path, up_port: int, sinks: list[dict[str, Any]], workers: int
) -> tuple[subprocess.Popen[bytes], int]:
    """A gateway of `workers` processes with these sinks; (process, proxy port) once it listens."""
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
    port = free_port()
    config = {
        "listeners": [{"host": "127.0.0.1", "port": port}],
        "rules_dir": str(folder / "rules"),
        "state_dir": str(folder / "state"),
        "resolver": {"hosts": {"api.test": ["127.0.0.2"]}},
        "address_guard": {"reachable_by_name": ["127.0.0.0/8"]},
        "log": {"level": "warning", "format": "json"},
        "workers": {"count": workers},
        "audit": {"sinks": sinks},
    }
    (folder / "sandgate.yaml").write_text(yaml.safe_dump(config))
    with (folder / "gateway.log").open("wb") as log:
        proc = subprocess.Popen(
            [SANDGATE, "run", "--config", str(folder / "sandgate.yaml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "BENCH_TOKEN": TOKEN},
        )
    try:
        wait_for_port("127.0.0.1", port, timeout=60)
    except TimeoutError:
        proc.kill()
        raise SystemExit(
            f"gateway in {folder} did not start:\n{(folder / 'gateway.log').read_text()}"
        ) from None
    return proc, port


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process (with its threads) has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (a supervisor's workers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def is_courier(pid: int) -> bool:
    """Whether `pid` is a one-process gateway's courier (proxy/audit/sinks/courier.py)."""
    try:
        return b"sandgate.proxy.audit.sinks.courier" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def cpu_split(pid: int) -> tuple[float, float]:
    """(CPU of the processes that decide, CPU of those that deliver): with workers, the
    deciding processes are the supervisor's children and the supervisor delivers; one
    process decides and its courier child delivers."""
    kids = children(pid)
    couriers = [k for k in kids if is_courier(k)]
    workers = [k for k in kids if k not in couriers]
    if not workers:
        return cpu_seconds(pid), sum(cpu_seconds(k) for k in couriers)
    return sum(cpu_seconds(k) for k in workers), cpu_seconds(pid)


def load(pid: int, port: int, up_port: int, seconds: float) -> dict[str, Any]:
    """One round through the gateway `pid` listening on `port`; with its CPU µs per request."""
    serving, supervisor = cpu_split(pid)
    out = subprocess.run(
        [
            *(sys.executable, str(REPO / "bench" / "loadclient.py"), "--address", f"127.0.0.1:{port}"),
            *("--url", f"http://api.test:{up_port}/x", "--proxy", "--auth", f"sb1:{TOKEN}"),
            *("--concurrency", "10", "--duration", str(seconds), "--warmup", "1"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    # The whole round's requests (warm-up included) over the gateway's CPU in the round.
    total = sum(int(n) for n in result["statuses"].values()) or 1
    serving_after, supervisor_after = cpu_split(pid)
    result["cpu_us_per_request"] = (serving_after - serving) / total * 1e6
    result["supervisor_cpu_us_per_request"] = (supervisor_after - supervisor) / total * 1e6
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--json")
    p.add_argument("--workers", type=int, default=1, help="gateway processes (>1: sinks in the supervisor)")
    args = p.parse_args()
    procs: list[subprocess.Popen[Any]] = []
    with tempfile.TemporaryDirectory(prefix="sandgate-bench-sinks-") as tmp:
        root = Path(tmp)
        up, up_port = upstream(root)
        procs.append(up)
        live = Receivers.start(root / "live")
        dead = Receivers.start(root / "dead")
        dead.stop_all()  # the third gateway's receivers: gone for the whole run
        try:
            gateways: list[tuple[int, int]] = []
            for i, rx in enumerate((None, live, dead)):
                folder = root / f"gw{i}"
                folder.mkdir()
                sinks = rx.sinks(folder / "hec.token") if rx is not None else []
                proc, port = gateway(folder, up_port, sinks, args.workers)
                procs.append(proc)
                gateways.append((proc.pid, port))
            figures: dict[str, list[dict[str, Any]]] = {row: [] for row in ROWS}
            for r in range(args.rounds):
                for row, (pid, port) in zip(ROWS, gateways, strict=True):
                    got = load(pid, port, up_port, args.seconds)
                    figures[row].append(got)
                    print(
                        f"round {r + 1} {row}: {got['rps']:.0f} req/s {got['statuses']} {got['first_error']}",
                        file=sys.stderr,
                        flush=True,
                    )
            print(report(figures, args))
            if args.json:
                Path(args.json).write_text(json.dumps(figures, indent=1))
            print(delivered(live), file=sys.stderr)
        finally:
            for proc in reversed(procs):
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
            live.stop_all()
    return 0


def report(figures: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    def med(row: str, key: str) -> float:
        return statistics.median(f[key] for f in figures[row])

    base, cpu_base = med(ROWS[0], "rps"), med(ROWS[0], "cpu_us_per_request")
    lines = [
        f"audit sinks, {args.workers} gateway process(es), {args.rounds} interleaved rounds of "
        f"{args.seconds:.0f} s, c10 keep-alive, plain HTTP",
        f"{'row':<14} {'req/s':>7} {'ratio':>6} {'p50 ms':>7} {'CPU µs/req':>11} {'ratio':>6}"
        f" {'delivery µs/req':>18}  req/s of each round",
    ]
    for row in ROWS:
        rate, cpu = med(row, "rps"), med(row, "cpu_us_per_request")
        each = " ".join(f"{f['rps']:.0f}" for f in figures[row])
        lines.append(
            f"{row:<14} {rate:>7.0f} {rate / base:>6.2f} {med(row, 'p50_ms'):>7.1f} {cpu:>11.0f}"
            f" {cpu / cpu_base:>6.2f} {med(row, 'supervisor_cpu_us_per_request'):>18.0f}  {each}"
        )
    return "\n".join(lines)


def delivered(rx: Receivers) -> str:
    got = rx.received()
    return "events at the live receivers: " + ", ".join(f"{k} {len(v)}" for k, v in got.items())


if __name__ == "__main__":
    raise SystemExit(main())
