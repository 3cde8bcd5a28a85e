"""The gateway's status file with workers: the lead's, plus how many workers serve and their pids.

Each worker writes its own status file in its folder (proxy/config.py: status_path). Once every
worker has, the supervisor writes the gateway's (`<state_dir>/gateway.json`, with its own pid),
so `sandgate status --wait`, `sandbox add` and `jail` read it as they read a single gateway's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandgate.proxy.state.statusfile import read_status, write_status

__all__ = ["GatewayStatus", "worker_status"]


def worker_status(path: Path, pid: int) -> dict[str, Any] | None:
    """The status a worker with this pid wrote (None: not yet, or a stale file of another)."""
    status = read_status(path)
    if status is None or status.get("pid") != pid:
        return None
    return status


class GatewayStatus:
    """Writes the gateway's status file when what it would say changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: dict[str, Any] | None = None

    def update(self, lead: dict[str, Any], pids: list[int]) -> bool:
        """Write the lead's status plus the workers' (True when the file changed)."""
        status = {k: v for k, v in lead.items() if k != "pid"}
        status["workers"] = len(pids)
        status["worker_pids"] = pids
        if status == self._written:
            return False
        write_status(self.path, status)
        self._written = status
        return True

    @property
    def written(self) -> bool:
        return self._written is not None
