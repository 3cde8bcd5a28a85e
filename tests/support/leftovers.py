"""Processes a test run started and left behind, found by a marker in their environment.

conftest.py puts `SANDGATE_TEST_RUN=<unique id>` into the test process's environment at
start, so every process a test starts (gateways, followers, servers, their children, even
ones that daemonized away from pytest's process tree) carries it. Only processes with this
run's id are ever touched: other test runs on the same machine have their own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MARKER", "Leftover", "leftovers", "new_run_id", "reap"]

MARKER = "SANDGATE_TEST_RUN"


@dataclass(frozen=True, slots=True)
class Leftover:
    pid: int
    command: str


def new_run_id() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # gone meanwhile, or a kernel thread
        return b""


def leftovers(run_id: str, *, exclude: frozenset[int] = frozenset()) -> list[Leftover]:
    """Live (not zombie) processes whose environment carries `MARKER=run_id`."""
    needle = f"{MARKER}={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        if needle not in _read(entry / "environ").split(b"\0"):
            continue
        stat = _read(entry / "stat")
        # The state follows the command name's closing parenthesis: Z is a zombie (exited).
        if stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z":
            continue
        command = _read(entry / "cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
        found.append(Leftover(int(entry.name), command[:200]))
    return found


def reap(run_id: str, *, exclude: frozenset[int], grace: float = 3.0) -> list[Leftover]:
    """Wait up to `grace` s for this run's processes to end; SIGTERM then SIGKILL the rest.
    Returns those that were still running (the leak to report)."""
    deadline = time.monotonic() + grace
    while (left := leftovers(run_id, exclude=exclude)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = leftovers(run_id, exclude=exclude)
        for p in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, sig)
        end = time.monotonic() + 3.0
        while alive and leftovers(run_id, exclude=exclude) and time.monotonic() < end:
            time.sleep(0.1)
    return left
