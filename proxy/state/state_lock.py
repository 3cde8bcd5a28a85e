"""One state folder, one gateway: `<state_dir>/gateway.lock`, locked (flock) for the gateway's life.

The gateway's first process (the supervisor of several workers, or the gateway itself with
one) takes the lock before it touches the state folder (CA, keys, limit relay, status file)
and holds it until it exits; the kernel lets it go with the process, even after a SIGKILL, so
a lock is never stale. A second `sandgate run` on the folder, or the private gateway of a
`sandgate jail`, stops with one line naming the folder and the pid that holds it. The file
holds that pid (written once the lock is taken) and is never removed: a gateway that unlinked
it on exit could let the next two lock two different files.

Readers (`status`, `stop`, `jail`) ask `holder()`, which tries a shared lock without waiting
and lets it go at once. That probe can hold the lock for an instant, so `hold()` retries for
a moment before it calls the folder taken.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from sandgate.proxy.errors import ConfigError, StateDirInUse

__all__ = ["LOCK_FILE", "hold", "holder", "holder_text"]

LOCK_FILE = "gateway.lock"
# How long hold() retries (a reader's probe holds the lock for microseconds) and how long a
# reader waits for the pid of a holder that has just taken the lock.
_TAKE_SECONDS = 1.0
_PID_SECONDS = 0.5
_RETRY_SECONDS = 0.02


def hold(state_path: Path) -> int:
    """Take the state folder's lock for the rest of this process's life and write this pid into
    it; StateDirInUse when another process holds it. The descriptor (returned) is never closed:
    the kernel lets the lock go when the process has exited, not before."""
    path = state_path / LOCK_FILE
    try:
        state_path.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise ConfigError(f"state_dir {state_path}: cannot lock {path}: {e.strerror}") from None
    try:
        _take(fd, state_path)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _take(fd: int, state_path: Path) -> None:
    deadline = time.monotonic() + _TAKE_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise StateDirInUse(
                    f"state_dir {state_path} is in use by the gateway with {holder_text(_pid_in(fd))} "
                    "(one gateway per state folder): stop it (sandgate stop), or give this one a "
                    "state_dir of its own"
                ) from None
            time.sleep(_RETRY_SECONDS)


def holder(state_path: Path) -> int | None:
    """The pid of the process that holds the state folder's lock (0: held, its pid not readable
    yet), or None when none does (or the lock file cannot be read: another user's gateway)."""
    try:
        fd = os.open(state_path / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _pid_in(fd)
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def holder_text(pid: int) -> str:
    """The holder's pid for a message, or what is known when it is not (yet) in the file."""
    return f"pid {pid}" if pid else "a pid not written yet"


def _pid_in(fd: int) -> int:
    """The live pid the lock file names. A holder writes it just after it took the lock: until
    then the file is empty or names the last holder, which is gone; wait a moment for it."""
    deadline = time.monotonic() + _PID_SECONDS
    while True:
        try:
            pid = int(os.pread(fd, 32, 0).decode().strip() or 0)
        except (OSError, ValueError):
            pid = 0
        if pid > 0 and _alive(pid):
            return pid
        if time.monotonic() >= deadline:
            return 0
        time.sleep(_RETRY_SECONDS)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # another user's
    except OSError:
        return False
    return True
