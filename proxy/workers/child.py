"""The worker's side of the supervisor: die with it, and leave the reason a start failed."""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.worker_role import SUPERVISOR_GONE

__all__ = ["PARENT_ENV", "SUPERVISOR_GONE", "bind_to_supervisor", "failure_path", "leave_start_failure"]

# Set by the supervisor in each worker's environment: its own pid.
PARENT_ENV = "SANDGATE_SUPERVISOR_PID"

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def bind_to_supervisor() -> None:
    """Signal SUPERVISOR_GONE to this process when the supervisor dies.

    prctl(PR_SET_PDEATHSIG) acts from the call on; a supervisor that died before it is
    caught by the parent-pid check (the process was re-parented already): exit at once. Until
    the gateway handles the signal, its default action ends a worker that has served nothing.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(SUPERVISOR_GONE), 0, 0, 0)
    expected = os.environ.get(PARENT_ENV, "")
    if expected.isdigit() and os.getppid() != int(expected):
        raise SystemExit(1)


def failure_path(folder: Path) -> Path:
    """Where a worker that could not start leaves its one line for the supervisor."""
    return folder / "start-failure"


def leave_start_failure(config: GatewayConfig, line: str) -> None:
    """Write why this worker did not start (the supervisor prints it when it gives up)."""
    if config.worker.count <= 1:
        return
    with contextlib.suppress(OSError):
        path = failure_path(config.worker_dir)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text(line.strip().splitlines()[0] if line.strip() else "did not start")
