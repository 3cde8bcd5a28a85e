"""A small tmpfs that a test can fill to the last byte and free again (needs root)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import uuid
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["SmallDisk"]


class SmallDisk:
    """A tmpfs of `size` mounted at `path`; `fill()` takes every free byte, `free()` gives them back."""

    def __init__(self, path: Path, size: str = "2m") -> None:
        self.path = path
        self.size = size
        self._filler = path / f".filler-{uuid.uuid4().hex}"

    def __enter__(self) -> Self:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0700", "tmpfs", str(self.path)],
            check=True,
            timeout=10,
        )
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False, timeout=10)

    def fill(self) -> int:
        """Write a filler file until the disk is full (page by page, then byte by byte); its size."""
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (b"\0" * 65536, b"\0" * 4096, b"\0"):
                while True:
                    try:
                        os.write(fd, chunk)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        break
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def free(self) -> None:
        """Remove the filler."""
        with contextlib.suppress(FileNotFoundError):
            self._filler.unlink()

    def is_full(self) -> bool:
        st = os.statvfs(self.path)
        return st.f_bavail == 0
