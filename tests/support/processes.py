"""Watching a gateway's processes from a test: wait for a condition, is a pid alive, the
supervisor's status once every worker serves."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

__all__ = ["alive", "gateway_status", "wait_until"]


class _Gateway(Protocol):
    root: Path


def wait_until[T](probe: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    """Poll `probe` until it returns something (not None, not False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value is not None and value is not False:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def gateway_status(gw: _Gateway) -> dict[str, Any] | None:
    """The gateway's status file once the supervisor wrote it (every worker serves)."""
    try:
        status: dict[str, Any] = json.loads((gw.root / "state" / "gateway.json").read_text())
    except (OSError, ValueError):
        return None
    return status if status.get("workers") == 2 else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False
