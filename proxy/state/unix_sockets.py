"""Unix sockets the gateway serves on: is one already in use, and where the internal ones live.

A socket's address holds at most 107 bytes of path. The internal sockets of a gateway with
workers (each peer's admin API, the audit collector, the limit relay) live beside the state
dir, in `<state_dir>/workers`, unless that path is too long for them (a deep state_dir): then
in a private folder under /tmp named after the state dir, which must be this user's alone.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
from pathlib import Path

from sandgate.proxy.errors import ConfigError

__all__ = ["MAX_SOCKET_PATH", "answers", "ensure_private_folder", "internal_socket_folder"]

MAX_SOCKET_PATH = 107  # sizeof(sun_path) - 1 on Linux
# The longest internal socket name: "limits.sock", "audit.sock", "w<i>.sock" (i < 10,000).
_LONGEST_NAME = 12


def answers(path: Path, timeout: float = 0.5) -> bool:
    """Whether a process accepts connections on this unix socket (a stale file does not)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def internal_socket_folder(state_path: Path) -> Path:
    """Where the internal sockets of the gateway on this state dir live (the same in every
    process of it: derived from the state dir's path alone)."""
    folder = state_path / "workers"
    if len(os.fsencode(folder)) + 1 + _LONGEST_NAME <= MAX_SOCKET_PATH:
        return folder
    digest = hashlib.sha256(os.fsencode(state_path)).hexdigest()[:16]
    # Fixed, not $TMPDIR: every process of the gateway must find the same folder; and
    # ensure_private_folder refuses one another user made first.
    return Path("/tmp") / f"sandgate-{digest}"  # noqa: S108


def ensure_private_folder(folder: Path) -> Path:
    """Create `folder` (0700) or check an existing one is a real folder of this user that no
    one else can write to or list; ConfigError naming it otherwise (someone else's folder could
    hold a socket that takes the gateway's audit records or admin calls)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise ConfigError(
            f"{folder}: the gateway's internal sockets need a folder of this user's alone "
            f"(mode 0700, not a link); found mode {stat.S_IMODE(info.st_mode):o}, owner uid {info.st_uid}"
        )
    return folder
