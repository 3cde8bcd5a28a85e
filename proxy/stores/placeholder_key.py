"""The key placeholders are minted from: loaded from a reference, or created on first start."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from sandgate.brokers import Secret
from sandgate.proxy.errors import ConfigError

__all__ = ["MIN_KEY_BYTES", "load_placeholder_key"]

MIN_KEY_BYTES = 32


def load_placeholder_key(reference: str, *, create: bool = True, min_bytes: int = MIN_KEY_BYTES) -> Secret:
    """The key from `env:VAR` or `file:PATH`; a missing file is created (mode 0600) when allowed.

    Also reads other small secrets of the gateway's own (an OPA token) with `min_bytes`.
    """
    scheme, _, value = reference.partition(":")
    if scheme == "env":
        text = os.environ.get(value, "")
        if len(text.encode()) < min_bytes:
            raise ConfigError(f"placeholder key: {value} must hold at least {min_bytes} bytes")
        return Secret(text)
    if scheme != "file":
        raise ConfigError("placeholder key: use env:VAR or file:PATH")
    path = Path(value).expanduser()
    if not path.exists() and create:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"placeholder key {path} is accessible by group or others; chmod 600 it")
        text = path.read_text().strip()
    except OSError as e:
        raise ConfigError(f"placeholder key {path}: {e.strerror}") from None
    if len(text.encode()) < min_bytes:
        raise ConfigError(f"placeholder key {path} must hold at least {min_bytes} bytes")
    return Secret(text)
