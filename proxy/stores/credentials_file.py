"""Stored credentials on one machine: `<state_dir>/credentials.sealed.json`, sealed, mode 0600.

Writers (concurrent CLI runs) take an exclusive lock on a side file, read, change and
atomically replace the document; readers need no lock (a replace is all or nothing).
The document: `{"format": 1, "credentials": {"<tenant>/<name>": record}}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sandgate.brokers import Secret
from sandgate.brokers.sealing import Keyring
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.stores.credentials import StoredRecord, check_names, entry_key, split_entry_key, utc_now
from sandgate.proxy.stores.protocols import CredentialInfo, StoreError
from sandgate.proxy.stores.sealing_keys import StoreKeys

__all__ = ["FileCredentialStore"]

FORMAT = 1
Records = dict[str, StoredRecord]


class FileCredentialStore:
    """A `CredentialStore` in one sealed JSON file; blocking work runs in worker threads."""

    def __init__(self, path: Path, keys: StoreKeys) -> None:
        self.path = path
        self._keys = keys

    # -- the protocol --------------------------------------------------------------------------

    async def list(self, tenant: str | None = None) -> list[CredentialInfo]:
        records = await asyncio.to_thread(self._read)
        infos = [rec.info(*split_entry_key(k)) for k, rec in records.items()]
        return sorted((i for i in infos if tenant is None or i.tenant == tenant), key=_order)

    async def put(self, tenant: str, name: str, value: Secret, *, must_exist: bool = False) -> CredentialInfo:
        """Add or replace (version + 1); with `must_exist`, StoreError(404) when it is not set."""
        check_names(tenant, name)
        if not value:
            raise StoreError("a credential value may not be empty")
        return await asyncio.to_thread(self._put, tenant, name, value, must_exist)

    async def get(self, tenant: str, name: str) -> Secret | None:
        return await asyncio.to_thread(self._get, tenant, name)

    async def remove(self, tenant: str, name: str) -> bool:
        def change(records: Records) -> bool:
            return records.pop(entry_key(tenant, name), None) is not None

        return await asyncio.to_thread(self._update, change)

    async def rekey(self) -> int:
        return await asyncio.to_thread(self._rekey)

    async def aclose(self) -> None:
        return None

    def stamp(self) -> tuple[int, int, int] | None:
        """What changes when the file is replaced (None when absent); blocking."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    # -- blocking work -------------------------------------------------------------------------

    def _keyring(self) -> Keyring:
        try:
            return self._keys.keyring()
        except ConfigError as e:
            raise StoreError(str(e), 500) from None

    def _get(self, tenant: str, name: str) -> Secret | None:
        record = self._read().get(entry_key(tenant, name))
        return None if record is None else record.open(self._keyring(), tenant, name)

    def _put(self, tenant: str, name: str, value: Secret, must_exist: bool) -> CredentialInfo:
        keyring = self._keyring()

        def change(records: Records) -> CredentialInfo:
            old = records.get(entry_key(tenant, name))
            if old is None and must_exist:
                raise StoreError(f"credential {name} of tenant {tenant} is not set", 404)
            version = 1 if old is None else old.version + 1
            record = StoredRecord.seal(keyring, tenant, name, value, version=version, updated=utc_now())
            records[entry_key(tenant, name)] = record
            return record.info(tenant, name)

        return self._update(change)

    def _rekey(self) -> int:
        keyring = self._keyring()

        def change(records: Records) -> int:
            count = 0
            for key, record in list(records.items()):
                if record.sealed.key_id == keyring.newest:
                    continue
                tenant, name = split_entry_key(key)
                value = record.open(keyring, tenant, name)
                resealed = StoredRecord.seal(
                    keyring, tenant, name, value, version=record.version, updated=record.updated
                )
                records[key] = resealed
                count += 1
            return count

        return self._update(change)

    def _read(self) -> Records:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise StoreError(f"{self.path}: {e.strerror}", 500) from None
        try:
            doc = json.loads(text)
        except ValueError:
            raise StoreError(f"{self.path}: not valid JSON", 500) from None
        if (
            not isinstance(doc, dict)
            or doc.get("format") != FORMAT
            or not isinstance(doc.get("credentials"), dict)
        ):
            raise StoreError(f"{self.path}: not a sandgate credential store (format {FORMAT})", 500)
        return {
            key: StoredRecord.from_dict(rec, f"{self.path}: {key}") for key, rec in doc["credentials"].items()
        }

    def _update[T](self, change: Callable[[Records], T]) -> T:
        """Apply `change` to the records under the writers' lock; write back only when it changed them."""
        with self._locked():
            records = self._read()
            before = {k: r.to_dict() for k, r in records.items()}
            result = change(records)
            if {k: r.to_dict() for k, r in records.items()} != before:
                self._write(records)
            return result

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _write(self, records: Records) -> None:
        doc: dict[str, Any] = {
            "format": FORMAT,
            "credentials": {k: records[k].to_dict() for k in sorted(records)},
        }
        fd, tmp = tempfile.mkstemp(prefix=".credentials.", dir=self.path.parent)  # mode 0600
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _order(info: CredentialInfo) -> tuple[str, str]:
    return (info.tenant, info.name)
