"""Sealing stored credential values: a ring of AES-256-GCM keys with ids, newest last.

A value is sealed with the newest key and a fresh random 96-bit nonce. The associated data
names the tenant and the credential, so a ciphertext copied onto another entry does not open.
Any key still in the ring opens what it sealed: add a key (new writes use it), re-seal the
stored values (`sandgate credentials rekey`), then drop the old key.

Key file format, one key a line, newest last (blank lines and `#` comments ignored):

    k1:<base64 of 32 random bytes>
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sandgate.brokers.errors import KeyringError, SealingError

__all__ = [
    "KEY_BYTES",
    "NONCE_BYTES",
    "Keyring",
    "Sealed",
    "associated_data",
    "format_key_line",
    "new_key",
    "next_key_id",
    "parse_keyring",
]

KEY_BYTES = 32
NONCE_BYTES = 12
_KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
_AD_TAG = b"sandgate/credential/v1"


@dataclass(frozen=True, slots=True)
class Sealed:
    """One sealed value: which key, the nonce, and the ciphertext with its 16-byte tag."""

    key_id: str
    nonce: bytes
    ciphertext: bytes


def associated_data(tenant: str, name: str) -> bytes:
    """What a sealed value is bound to: the tenant and the credential name (NUL-separated)."""
    return b"\x00".join((_AD_TAG, tenant.encode(), name.encode()))


class Keyring:
    """AES-256-GCM keys by id; `seal` uses the newest (last), `open` any of them.

    The key bytes live only inside the cipher objects; the repr shows ids, never keys.
    """

    __slots__ = ("_ciphers", "_ids")

    def __init__(self, keys: Sequence[tuple[str, bytes]]) -> None:
        if not keys:
            raise KeyringError("the keyring holds no key")
        ciphers: dict[str, AESGCM] = {}
        for key_id, key in keys:
            if not _KEY_ID.match(key_id):
                raise KeyringError(f"key id {key_id!r} is not 1-32 letters, digits, '_', '.' or '-'")
            if key_id in ciphers:
                raise KeyringError(f"key id {key_id} appears twice")
            if len(key) != KEY_BYTES:
                raise KeyringError(f"key {key_id} is {len(key)} bytes; AES-256 needs {KEY_BYTES}")
            ciphers[key_id] = AESGCM(key)
        self._ciphers = ciphers
        self._ids = tuple(ciphers)

    @property
    def ids(self) -> tuple[str, ...]:
        """Key ids, oldest first."""
        return self._ids

    @property
    def newest(self) -> str:
        """The id new values are sealed with."""
        return self._ids[-1]

    def seal(self, plaintext: bytes, context: bytes) -> Sealed:
        """Seal with the newest key and a fresh random nonce."""
        nonce = os.urandom(NONCE_BYTES)
        return Sealed(self.newest, nonce, self._ciphers[self.newest].encrypt(nonce, plaintext, context))

    def open(self, sealed: Sealed, context: bytes) -> bytes:
        """The plaintext; SealingError for an unknown key id or data that does not authenticate."""
        cipher = self._ciphers.get(sealed.key_id)
        if cipher is None:
            raise SealingError(
                f"sealed with key {sealed.key_id}, which is not in the keyring (have: {', '.join(self._ids)})"
            )
        if len(sealed.nonce) != NONCE_BYTES:
            raise SealingError("the sealed value's nonce is malformed")
        try:
            return cipher.decrypt(sealed.nonce, sealed.ciphertext, context)
        except InvalidTag:
            raise SealingError(
                f"the sealed value does not open with key {sealed.key_id}: "
                "altered, or moved from another entry"
            ) from None

    def __repr__(self) -> str:
        return f"Keyring(ids={list(self._ids)!r})"


def new_key() -> bytes:
    """32 random bytes for a new AES-256 key."""
    return os.urandom(KEY_BYTES)


def format_key_line(key_id: str, key: bytes) -> str:
    """One line of a key file: `id:base64key`."""
    return f"{key_id}:{base64.b64encode(key).decode()}"


def next_key_id(existing: Sequence[str]) -> str:
    """`k<N>` with N one more than the highest `k<digits>` id present (k1 for an empty ring)."""
    numbers = [int(i[1:]) for i in existing if re.fullmatch(r"k\d{1,9}", i)]
    return f"k{max(numbers, default=0) + 1}"


def parse_keyring(text: str, where: str) -> Keyring:
    """A keyring from key-file text; KeyringError names `where` and the line, never the key."""
    keys: list[tuple[str, bytes]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key_id, colon, encoded = line.partition(":")
        if not colon:
            raise KeyringError(f"{where}:{lineno}: expected 'id:base64key'")
        key_id = key_id.strip()
        if not _KEY_ID.match(key_id):
            # Not echoed: a malformed line may hold key material before its first ':'.
            raise KeyringError(f"{where}:{lineno}: the key id is not 1-32 letters, digits, '_', '.' or '-'")
        try:
            key = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise KeyringError(f"{where}:{lineno}: key {key_id} is not valid base64") from None
        keys.append((key_id, key))
    if not keys:
        raise KeyringError(f"{where}: holds no key")
    try:
        return Keyring(keys)
    except KeyringError as e:
        raise KeyringError(f"{where}: {e}") from None
