"""`<state_dir>/gateway.json`: what a running gateway serves, for `sandbox add` and `jail`.

Written at start-up and after each reload; removed on a clean exit. A reader trusts it only
while the pid in it is alive.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["STATUS_FILE", "read_status", "remove_status", "write_status"]

# The status file's name in a gateway's state_dir.
STATUS_FILE = "gateway.json"


def write_status(path: Path, status: dict[str, Any]) -> None:
    """Replace the status file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **status}, indent=2) + "\n")
    tmp.replace(path)


def read_status(path: Path) -> dict[str, Any] | None:
    """The status of a live gateway, or None (no file, unreadable, or its process is gone)."""
    try:
        status = json.loads(path.read_text())
        pid = int(status["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass  # alive, run by another user (the systemd unit's `sandgate`, say)
    except OSError:
        return None
    return status if isinstance(status, dict) else None


def remove_status(path: Path) -> None:
    """Remove the status file if it is this process's."""
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass
