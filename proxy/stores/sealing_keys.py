"""The keys stored credentials are sealed with: `file:PATH` (re-read when it changes) or `env:VAR`.

One machine: `<state_dir>/store.keys` is created (mode 0600, one key) on first use, like the
placeholder key. A fleet (redis configured): every gateway needs the same keys, so a missing
file is an error that says so instead of a fresh key only this host would have.
"""

from __future__ import annotations

import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from sandgate.brokers.errors import KeyringError
from sandgate.brokers.sealing import Keyring, format_key_line, new_key, next_key_id, parse_keyring
from sandgate.proxy.errors import ConfigError

__all__ = ["StoreKeys"]


@dataclass(frozen=True, slots=True)
class _Loaded:
    stamp: tuple[int, int, int, int]
    keyring: Keyring


class StoreKeys:
    """Loads the keyring from its reference; blocking (call it off the event loop)."""

    def __init__(self, reference: str, *, create: bool) -> None:
        scheme, colon, value = reference.partition(":")
        if not colon or scheme not in ("file", "env") or not value:
            raise ConfigError("credentials.store_keys: use file:PATH or env:VAR")
        self.reference = reference
        self._scheme = scheme
        self._value = value
        self._create = create
        self._loaded: _Loaded | None = None

    @property
    def path(self) -> Path | None:
        return Path(self._value).expanduser() if self._scheme == "file" else None

    def keyring(self) -> Keyring:
        """The current keyring; a changed file is re-read, a missing one created when allowed."""
        if self._scheme == "env":
            text = os.environ.get(self._value, "")
            if not text.strip():
                raise ConfigError(f"credentials.store_keys: environment variable {self._value} is empty")
            return self._parse(text, f"${self._value}")
        path = self.path
        assert path is not None
        if not path.exists():
            if not self._create:
                raise ConfigError(
                    f"store keys {path} do not exist: create them once with `sandgate credentials add-key` "
                    "and copy the file to every gateway of the fleet"
                )
            self._append_key(path, only_if_empty=True)
        try:
            st = path.stat()
        except OSError as e:
            raise ConfigError(f"store keys {path}: {e.strerror}") from None
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"store keys {path} are accessible by group or others; chmod 600 it")
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if self._loaded is not None and self._loaded.stamp == stamp:
            return self._loaded.keyring
        try:
            text = path.read_text()
            if not text.strip() and self._create:
                # Another process created the file and has not written its key yet: its write
                # holds the file's lock, and appending only-if-empty waits for it.
                self._append_key(path, only_if_empty=True)
                text = path.read_text()
        except OSError as e:
            raise ConfigError(f"store keys {path}: {e.strerror}") from None
        keyring = self._parse(text, str(path))
        self._loaded = _Loaded(stamp, keyring)
        return keyring

    def add_key(self) -> str:
        """Append a new key (it becomes the newest, used for new writes); returns its id."""
        path = self.path
        if path is None:
            raise ConfigError("credentials.store_keys is an environment variable: add the key there")
        return self._append_key(path)

    @staticmethod
    def _parse(text: str, where: str) -> Keyring:
        try:
            return parse_keyring(text, where)
        except KeyringError as e:
            raise ConfigError(str(e)) from None

    @staticmethod
    def _append_key(path: Path, *, only_if_empty: bool = False) -> str:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # two first uses at once must not both write k1
            f.seek(0)
            text = f.read()
            ids = []
            if text.strip():
                ids = list(StoreKeys._parse(text, str(path)).ids)
                if only_if_empty:
                    return ids[-1]  # another process created it first
            key_id = next_key_id(ids)
            sep = "" if not text or text.endswith("\n") else "\n"
            f.write(f"{sep}{format_key_line(key_id, new_key())}\n")
            f.flush()
            os.fsync(f.fileno())
        return key_id
