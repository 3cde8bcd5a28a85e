"""What both credential store backends share: the sealed record and its checks.

A record is `{key_id, nonce, ciphertext, version, updated}` (nonce and ciphertext base64),
stored under `<tenant>/<name>`; only ciphertext is ever at rest. The value is sealed with
associated data naming the tenant and the credential, so a record copied onto another
entry does not open.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from sandgate.brokers import Secret
from sandgate.brokers.errors import SealingError
from sandgate.brokers.sealing import Keyring, Sealed, associated_data
from sandgate.policy.model.tenant import NAME_PATTERN
from sandgate.proxy.stores.protocols import CredentialInfo, CredentialStore, StoreError

__all__ = [
    "RekeyableStore",
    "StoredRecord",
    "check_names",
    "entry_key",
    "split_entry_key",
    "utc_now",
]

_NAME = re.compile(NAME_PATTERN)


class RekeyableStore(CredentialStore, Protocol):
    """A credential store that can also refuse to create on rotate and re-seal with the newest key."""

    async def put(self, tenant: str, name: str, value: Secret, *, must_exist: bool = False) -> CredentialInfo:
        """Add or replace (version + 1); with `must_exist`, StoreError(404) when it is not set."""
        ...

    async def rekey(self) -> int:
        """Re-seal values sealed with an older key; returns how many were re-sealed."""
        ...

    async def aclose(self) -> None: ...


def check_names(tenant: str, name: str) -> None:
    """StoreError(400) unless both are names as tenant files spell them."""
    for what, value in (("tenant", tenant), ("credential name", name)):
        if not _NAME.match(value):
            raise StoreError(f"{what} {value!r} is not valid (lower-case letters, digits, '.', '_', '-')")


def entry_key(tenant: str, name: str) -> str:
    return f"{tenant}/{name}"


def split_entry_key(key: str) -> tuple[str, str]:
    tenant, _, name = key.partition("/")
    return tenant, name


def utc_now() -> str:
    """RFC 3339 UTC, seconds precision."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One sealed credential value at rest."""

    sealed: Sealed
    version: int
    updated: str

    @classmethod
    def seal(
        cls, keyring: Keyring, tenant: str, name: str, value: Secret, *, version: int, updated: str
    ) -> StoredRecord:
        return cls(keyring.seal(value.reveal_bytes(), associated_data(tenant, name)), version, updated)

    def open(self, keyring: Keyring, tenant: str, name: str) -> Secret:
        """The value; StoreError(500) when it does not open (no value in the message)."""
        try:
            return Secret(keyring.open(self.sealed, associated_data(tenant, name)))
        except SealingError as e:
            raise StoreError(f"stored credential {name} of tenant {tenant}: {e}", 500) from None

    def info(self, tenant: str, name: str) -> CredentialInfo:
        return CredentialInfo(tenant=tenant, name=name, version=self.version, updated=self.updated)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key_id": self.sealed.key_id,
            "nonce": base64.b64encode(self.sealed.nonce).decode(),
            "ciphertext": base64.b64encode(self.sealed.ciphertext).decode(),
            "version": self.version,
            "updated": self.updated,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, doc: object, where: str) -> StoredRecord:
        """A record from its stored form; StoreError(500) naming `where` when malformed."""
        try:
            if not isinstance(doc, dict):
                raise TypeError
            version = doc["version"]
            if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                raise TypeError
            sealed = Sealed(
                key_id=str(doc["key_id"]),
                nonce=base64.b64decode(doc["nonce"], validate=True),
                ciphertext=base64.b64decode(doc["ciphertext"], validate=True),
            )
            return cls(sealed, version, str(doc["updated"]))
        except (KeyError, TypeError, ValueError, binascii.Error):
            raise StoreError(f"{where}: malformed stored credential record", 500) from None

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> StoredRecord:
        try:
            doc = json.loads(text)
        except ValueError:
            raise StoreError(f"{where}: malformed stored credential record", 500) from None
        return cls.from_dict(doc, where)
