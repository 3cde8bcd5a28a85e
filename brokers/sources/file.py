"""`file:PATH`: a secret from a private file, re-read whenever the file changes."""

from __future__ import annotations

import asyncio
import os
import stat
from dataclasses import dataclass

from sandgate.brokers.errors import SecretUnavailable
from sandgate.brokers.secret import Secret
from sandgate.policy.model.secret_refs import SecretRef

__all__ = ["FileSource"]

MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class _Stamp:
    """What identifies one version of a file: replaced, rewritten or resized means re-read."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int


@dataclass(frozen=True, slots=True)
class _Cached:
    stamp: _Stamp
    secret: Secret


def _stamp(st: os.stat_result) -> _Stamp:
    return _Stamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _check_private(path: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise SecretUnavailable(f"secret file {path} is not a regular file")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretUnavailable(
            f"secret file {path} is accessible by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            "chmod 600 it"
        )
    if st.st_size > MAX_FILE_BYTES:
        raise SecretUnavailable(f"secret file {path} is larger than {MAX_FILE_BYTES} bytes")


def _read(path: str, cached: _Cached | None) -> _Cached:
    """Stat (and, when it changed, read) a secret file; runs in a worker thread."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise SecretUnavailable(f"cannot read secret file {path}: {e.strerror}") from None
    _check_private(path, st)
    stamp = _stamp(st)
    if cached is not None and cached.stamp == stamp:
        return cached
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            _check_private(path, st)
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise SecretUnavailable(f"cannot read secret file {path}: {e.strerror}") from None
    value = data.strip()
    if len(data) > MAX_FILE_BYTES:
        raise SecretUnavailable(f"secret file {path} is larger than {MAX_FILE_BYTES} bytes")
    if not value:
        raise SecretUnavailable(f"secret file {path} is empty")
    return _Cached(_stamp(st), Secret(value))


class FileSource:
    """Each `get` stats the file off the event loop and re-reads it when its stamp changed.

    A file that is group or world accessible is refused every time (a `chmod` is noticed
    on the next use); surrounding whitespace (a trailing newline) is stripped.
    """

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[str, _Cached] = {}

    async def get(self, ref: SecretRef) -> Secret:
        path = ref.value
        if not path.startswith("/"):
            raise SecretUnavailable(f"secret file path {path} is not absolute")
        cached = await asyncio.to_thread(_read, path, self._cache.get(path))
        self._cache[path] = cached
        return cached.secret
