"""Unix sockets the gateway serves on (admin API, audit collector): is one already in use?"""

from __future__ import annotations

import socket
from pathlib import Path

__all__ = ["answers"]


def answers(path: Path, timeout: float = 0.5) -> bool:
    """Whether a process accepts connections on this unix socket (a stale file does not)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True
