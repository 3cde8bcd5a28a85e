"""CPU a `sandgate` command spends before it does anything: imports and argument parsing.

    .venv/bin/python bench/cli_startup.py [--runs N]

Each command runs N times in a fresh interpreter (the installed `sandgate` entry point);
the CPU time (user + system, from the child's rusage) of each run is taken, and the median
is printed. CPU, not wall time: it is what a loaded host pays, and it is steadier than wall
time when other work shares the machine. The commands need no running gateway: `status`
exits 1 at once when none answers. The last row is `sandgate run` (one worker) from exec
until its proxy port accepts: its CPU then (from /proc) and the wall time.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SANDGATE = str(Path(sys.executable).with_name("sandgate"))


def cpu_seconds(argv: list[str], cwd: str) -> float:
    """User + system CPU of one run of argv (its exit status is not the point here)."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return usage.ru_utime + usage.ru_stime


def gateway_start(config: Path, cwd: str) -> tuple[float, float]:
    """(CPU s, wall s) of `sandgate run` from exec until its proxy port accepts a connection."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [SANDGATE, "run", "--config", str(config), "--port", str(port)]
    env = {**os.environ, "SANDGATE_WORKERS": "1"}
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None or time.monotonic() - started > 60:
                raise SystemExit(f"sandgate run did not start (exit {proc.returncode})")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.01)
        wall = time.monotonic() - started
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    finally:
        proc.terminate()
        proc.wait(30)
    return cpu, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sandgate-bench-cli-") as tmp:
        config = Path(tmp) / "sandgate.yaml"
        config.write_text(f"state_dir: {tmp}/state\nrules_dir: {tmp}/rules\n")
        (Path(tmp) / "rules").mkdir()
        audit = Path(tmp) / "audit.jsonl"
        audit.write_text("")
        commands = {
            "sandgate --version": [SANDGATE, "--version"],
            "sandgate status (no gateway)": [SANDGATE, "status", "--config", str(config)],
            "sandgate audit tail -n 1 --file F": [SANDGATE, "audit", "tail", "-n", "1", "--file", str(audit)],
            "sandgate policy check (empty rules)": [SANDGATE, "policy", "check", "--config", str(config)],
        }
        print(f"| command | CPU s (median of {args.runs}) |")
        print("|---|---:|")
        for name, argv in commands.items():
            samples = [cpu_seconds(argv, tmp) for _ in range(args.runs)]
            print(f"| `{name}` | {statistics.median(samples):.2f} |")
        gateway_start(config, tmp)  # the first start makes the CA: not what a restart pays
        starts = [gateway_start(config, tmp) for _ in range(args.runs)]
        cpu = statistics.median(c for c, _ in starts)
        wall = statistics.median(w for _, w in starts)
        print(f"| `sandgate run` until it listens (wall {wall:.2f} s) | {cpu:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
