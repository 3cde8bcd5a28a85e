"""Which worker of a gateway this process is: its index among `count` processes under one supervisor.

A gateway with workers runs one supervisor and `count` gateway processes (one worker is just
the gateway process, with no supervisor). Worker 0 is the lead
(it serves the gateway's admin API and status); every worker accepts on the shared explicit
listener (SO_REUSEPORT), and worker `i` alone owns transparent port `base + i` and DNS port
`base + i`, so that the host rules can steer each sandbox to one worker for both.
"""

from __future__ import annotations

import hashlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ENV", "SINGLE", "SUPERVISOR_GONE", "WorkerRole", "worker_for"]

# Set by the supervisor in each worker's environment: "<index>/<count>".
ENV = "SANDGATE_WORKER"
# Sent to a worker when its supervisor dies (even by SIGKILL; proxy/workers/child.py). Not
# SIGTERM: the kernel sends the parent-death signal again as each of the dying supervisor's
# threads exits, and a second SIGTERM cuts a drain short. A worker takes the first, ignores the
# rest, drains and spools.
SUPERVISOR_GONE = signal.SIGUSR2


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """This process's place among the gateway's workers (index 0 of 1 without a supervisor)."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not (self.count >= 1 and 0 <= self.index < self.count):
            raise ValueError(f"worker {self.index} of {self.count}: expected 0 <= index < count")

    @property
    def lead(self) -> bool:
        """Worker 0: it serves the gateway's admin API, status and host rules."""
        return self.index == 0

    def port(self, base: int) -> int:
        """This worker's own transparent or DNS port (port 0 stays "any free port")."""
        return base + self.index if base else 0

    def folder(self, state: Path) -> Path:
        """This worker's own files (status, private admin socket, spools) under the state dir."""
        return state / "workers" / f"w{self.index}"

    def label(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def from_env(cls) -> WorkerRole:
        """The role the supervisor gave this process, or SINGLE when it has none."""
        text = os.environ.get(ENV)
        if not text:
            return SINGLE
        index, _, count = text.partition("/")
        return cls(int(index), int(count))


SINGLE = WorkerRole()


def worker_for(key: str, count: int) -> int:
    """The worker a sandbox is steered to: a stable hash of its key (interface name), the same
    in every process and across restarts (Python's hash() is salted per process)."""
    if count <= 1:
        return 0
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % count
