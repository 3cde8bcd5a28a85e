"""What processes that are gone left behind in a state dir, settled into the trail.

Run by whoever writes the trail: the supervisor (at start, when a worker exits, and every few
seconds for workers of an earlier gateway that were still draining), or a gateway of one
process at its start. First the spools (records a worker wrote while its collector was gone),
then the intent journals (what went upstream without a record yet): each record lands once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandgate.proxy.audit.intents import read_leftovers, settle_leftovers
from sandgate.proxy.audit.spool import ids_in_trail, merge_spools

__all__ = [
    "Settled",
    "cut_count_path",
    "pid_alive",
    "process_folders",
    "read_cut_count",
    "settle_dead_processes",
    "write_cut_count",
]


@dataclass(frozen=True)
class Settled:
    """Records merged from spools, and records written for intents cut by a process's exit."""

    merged: int = 0
    cut: int = 0


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited but not reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def process_folders(state_path: Path) -> list[Path]:
    """The folders a gateway's processes keep their own files in: the state dir (one process)
    and each worker's folder."""
    workers = state_path / "workers"
    found = sorted(p for p in workers.glob("w*") if p.is_dir()) if workers.is_dir() else []
    return [state_path, *found]


def settle_dead_processes(
    state_path: Path,
    audit_path: Path,
    write: Callable[[list[str]], None],
    alive: Callable[[int], bool] = pid_alive,
) -> Settled:
    """Merge the spools and settle the intent journals of every process that is gone; OSError
    from `write` leaves what it could not write for the next call."""
    folders = process_folders(state_path)
    merged = merge_spools(folders, audit_path, write, alive)
    leftovers = [left for folder in folders for left in read_leftovers(folder, alive)]
    cut = settle_leftovers(leftovers, lambda ids: ids_in_trail(audit_path, ids), write)
    return Settled(merged, cut)


def cut_count_path(state_path: Path) -> Path:
    """Where the supervisor keeps its count of records written for cut intents (for /metrics)."""
    return state_path / "workers" / "cut-by-exit.count"


def write_cut_count(state_path: Path, count: int) -> None:
    path = cut_count_path(state_path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{count}\n")
    tmp.replace(path)


def read_cut_count(state_path: Path) -> int:
    try:
        return int(cut_count_path(state_path).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0
