"""Placeholders: what a guest holds instead of a secret, minted from the gateway key.

`sgph_` + 32 base32 characters (lower case): 120 bits of HMAC-SHA256 over (tenant,
sandbox, credential) and a 40-bit tag over those bits. Every gateway holding the same key
mints the same placeholder for the same triple, so a fleet agrees without sharing state;
without the key a placeholder can be neither guessed nor forged, and it carries nothing
derived from the secret. The alphabet has no case, so a guest that changes the case of a
placeholder still names the same one (matching lower-cases first).

Anything *shaped* like a placeholder (`sgph_` and at least `MIN_SHAPE_CHARS` alphabet
characters, any case: truncated, extended, forged, another key's) is matched too, so that
the broker can refuse what this gateway did not mint instead of forwarding it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sandgate.brokers.errors import BrokerConfigError
from sandgate.brokers.secret import Secret

__all__ = [
    "MIN_KEY_BYTES",
    "MIN_SHAPE_CHARS",
    "PLACEHOLDER_LENGTH",
    "PLACEHOLDER_PATTERN",
    "PLACEHOLDER_PREFIX",
    "PlaceholderIndex",
    "PlaceholderMinter",
    "PlaceholderOwner",
]

PLACEHOLDER_PREFIX = "sgph_"
_ID_BYTES = 15
_TAG_BYTES = 5
_BODY_CHARS = (_ID_BYTES + _TAG_BYTES) * 8 // 5
PLACEHOLDER_LENGTH = len(PLACEHOLDER_PREFIX) + _BODY_CHARS
# Fewer alphabet characters after the prefix are too common by chance to refuse ("sgph_log").
MIN_SHAPE_CHARS = 8
# Applied to lower-cased bytes. Greedy on purpose: a placeholder with characters appended (or
# cut off) is one placeholder-shaped value of the wrong length, which no owner matches.
PLACEHOLDER_PATTERN = re.compile(re.escape(PLACEHOLDER_PREFIX.encode()) + rb"[a-z2-7]{%d,}" % MIN_SHAPE_CHARS)
MIN_KEY_BYTES = 32

_MINT_LABEL = b"sandgate placeholder v1\x00"
_TAG_LABEL = b"sandgate placeholder tag v1\x00"


@dataclass(frozen=True, slots=True)
class PlaceholderOwner:
    """Whose placeholder it is: one credential of one sandbox of one tenant."""

    tenant: str
    sandbox: str
    credential: str


def _field(text: str) -> bytes:
    data = text.encode("utf-8")
    return len(data).to_bytes(4, "big") + data


class PlaceholderMinter:
    """Mints and authenticates placeholders with a gateway key of at least 32 bytes."""

    __slots__ = ("_key",)

    def __init__(self, key: Secret) -> None:
        raw = key.reveal_bytes()
        if len(raw) < MIN_KEY_BYTES:
            raise BrokerConfigError(f"the placeholder key must be at least {MIN_KEY_BYTES} bytes")
        # A derived key: the configured one may serve other purposes too.
        self._key = hmac.new(raw, b"sandgate placeholders", hashlib.sha256).digest()

    def mint(self, tenant: str, sandbox: str, credential: str) -> str:
        """The placeholder of (tenant, sandbox, credential); the same on every gateway with this key."""
        message = _MINT_LABEL + _field(tenant) + _field(sandbox) + _field(credential)
        ident = hmac.new(self._key, message, hashlib.sha256).digest()[:_ID_BYTES]
        return PLACEHOLDER_PREFIX + base64.b32encode(ident + self._tag(ident)).decode("ascii").lower()

    def is_genuine(self, placeholder: str) -> bool:
        """Whether a placeholder-shaped string was minted with this key (for any owner)."""
        text = placeholder.lower()
        if len(text) != PLACEHOLDER_LENGTH or not text.startswith(PLACEHOLDER_PREFIX):
            return False
        try:
            raw = base64.b32decode(text[len(PLACEHOLDER_PREFIX) :].upper())
        except (binascii.Error, ValueError):
            return False
        ident, tag = raw[:_ID_BYTES], raw[_ID_BYTES:]
        return hmac.compare_digest(tag, self._tag(ident))

    def _tag(self, ident: bytes) -> bytes:
        return hmac.new(self._key, _TAG_LABEL + ident, hashlib.sha256).digest()[:_TAG_BYTES]


class PlaceholderIndex:
    """Placeholder → owner for every (tenant, sandbox, credential) this gateway knows."""

    __slots__ = ("_by_placeholder", "_by_sandbox", "minter")

    def __init__(self, minter: PlaceholderMinter, owners: Iterable[PlaceholderOwner] = ()) -> None:
        self.minter = minter
        self._by_placeholder: dict[str, PlaceholderOwner] = {}
        self._by_sandbox: dict[tuple[str, str], dict[str, str]] = {}
        for owner in owners:
            placeholder = minter.mint(owner.tenant, owner.sandbox, owner.credential)
            self._by_placeholder[placeholder] = owner
            self._by_sandbox.setdefault((owner.tenant, owner.sandbox), {})[owner.credential] = placeholder

    def __len__(self) -> int:
        return len(self._by_placeholder)

    def owner(self, placeholder: str) -> PlaceholderOwner | None:
        """The owner of a placeholder (any case), or None if it was not minted for anyone known here."""
        return self._by_placeholder.get(placeholder.lower())

    def placeholder(self, tenant: str, sandbox: str, credential: str) -> str | None:
        """The placeholder of a known (tenant, sandbox, credential)."""
        return self._by_sandbox.get((tenant, sandbox), {}).get(credential)

    def for_sandbox(self, tenant: str, sandbox: str) -> Mapping[str, str]:
        """Credential name → placeholder for one sandbox (what its environment should hold)."""
        return dict(self._by_sandbox.get((tenant, sandbox), {}))
