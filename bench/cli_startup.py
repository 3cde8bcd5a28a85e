"""CPU a `sandgate` command spends before it does anything: imports and argument parsing.

    .venv/bin/python bench/cli_startup.py [--runs N]

Each command runs N times in a fresh interpreter (the installed `sandgate` entry point);
the CPU time (user + system, from the child's rusage) of each run is taken, and the median
is printed. CPU, not wall time: it is what a loaded host pays, and it is steadier than wall
time when other work shares the machine. The commands need no running gateway: `status`
exits 1 at once when none answers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SANDGATE = str(Path(sys.executable).with_name("sandgate"))


def cpu_seconds(argv: list[str], cwd: str) -> float:
    """User + system CPU of one run of argv (its exit status is not the point here)."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return usage.ru_utime + usage.ru_stime


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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
