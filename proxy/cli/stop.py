"""`sandgate stop [--config F] [--timeout S]`: stop the local gateway and wait until it is gone.

The gateway is the process that holds its state folder's lock (proxy/state/state_lock.py): the
supervisor of several workers, or the gateway process itself. It gets one SIGTERM, as from
`kill` or systemd, and drains (shutdown.drain_seconds; a supervisor forwards the signal to
every worker and kills what is left workers.stop_margin_seconds later) before it exits. A
worker is never signalled directly: its supervisor would only start it again.

Exit 0: the gateway stopped. 1: none runs on this state folder, it could not be signalled, or
it still ran after --timeout (default: drain_seconds + stop_margin_seconds + 10 s), with one
line saying which. 2: usage or a broken config.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sandgate.proxy.config import GatewayConfig, load_config
from sandgate.proxy.state.state_lock import holder
from sandgate.proxy.state.statusfile import read_status

__all__ = ["default_timeout", "run_stop_command"]

EXIT_OK, EXIT_FAILED = 0, 1
POLL_SECONDS = 0.1
# Past the longest a gateway takes to stop on its own (drain, then the supervisor's kill).
_SLACK_SECONDS = 10.0


def default_timeout(config: GatewayConfig) -> float:
    """How long a gateway on this config may take to stop before `stop` gives up."""
    return config.shutdown.drain_seconds + config.workers.stop_margin_seconds + _SLACK_SECONDS


def run_stop_command(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    timeout = args.timeout if args.timeout is not None else default_timeout(config)
    found = _gateway(config)
    if isinstance(found, str):
        print(f"sandgate: {found}", file=sys.stderr)
        return EXIT_FAILED
    pid, gone = found
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # it exited since: stopped all the same
    except PermissionError:
        print(
            f"sandgate: gateway pid {pid} runs as another user: run sandgate stop as that user",
            file=sys.stderr,
        )
        return EXIT_FAILED
    try:
        stopped = _wait(gone, timeout)
    except KeyboardInterrupt:
        return 130
    if not stopped:
        print(f"sandgate: gateway (pid {pid}) still runs after {timeout:g} s", file=sys.stderr)
        return EXIT_FAILED
    print(f"stopped: gateway (pid {pid})")
    return EXIT_OK


def _gateway(config: GatewayConfig) -> tuple[int, Callable[[], bool]] | str:
    """The gateway's pid and a test for "it is gone": the lock's holder (gone once the lock is
    free), else a live status file's pid (a gateway whose lock this user cannot read); or why
    there is none to stop."""
    state = config.state_path
    pid = holder(state)
    if pid:
        # The lock goes when the process has exited; a zombie (not reaped yet) counts as gone.
        return pid, lambda: holder(state) != pid and not _alive(pid)
    if pid == 0:
        return f"a gateway holds state_dir {state} but has not written its pid yet: try again"
    status = read_status(config.status_path)
    if status is None:
        return f"no gateway runs with state_dir {state}"
    pid = int(status["pid"])
    return pid, lambda: not _alive(pid)


def _wait(gone: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not gone():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie, exited but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return True
