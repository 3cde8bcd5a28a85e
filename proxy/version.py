"""The installed versions of sandgate and of what it runs on, for `--version` and the banner."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

__all__ = ["version_line", "version_of"]


def version_of(package: str) -> str:
    """An installed distribution's version, or "unknown"."""
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def version_line() -> str:
    """`sandgate 0.1.0 (mitmproxy 12.3.1, Python 3.13.0)`."""
    python = ".".join(map(str, sys.version_info[:3]))
    return f"sandgate {version_of('sandgate')} (mitmproxy {version_of('mitmproxy')}, Python {python})"
