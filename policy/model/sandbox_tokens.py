"""Sandbox proxy tokens: references resolved at load, kept only as SHA-256 digests.

A reference is `env:VAR`, `file:PATH` (relative to the tenant file; refused when group or
world readable) or `sha256:HEX` (safe to keep in a world-readable file).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
from pathlib import Path

from sandgate.policy.errors import TokenFileMissingError, TokenReferenceError

__all__ = ["digest_token", "new_token", "resolve_token_reference", "tokens_equal"]

_MIN_TOKEN_CHARS = 16
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


def digest_token(token: str) -> bytes:
    """The SHA-256 digest a token is stored and compared as."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def tokens_equal(presented: str, expected_digest: bytes) -> bool:
    """Constant-time comparison of a presented token against a stored digest."""
    return hmac.compare_digest(digest_token(presented), expected_digest)


def new_token() -> str:
    """A fresh random proxy token."""
    return secrets.token_urlsafe(24)


def resolve_token_reference(reference: str, base_dir: Path) -> bytes:
    """Resolve a token reference into its digest; the token itself is not kept."""
    scheme, _, value = reference.partition(":")
    if scheme == "sha256":
        if not _SHA256_HEX.fullmatch(value):
            raise TokenReferenceError("sha256: needs 64 hex digits")
        return bytes.fromhex(value)
    if scheme == "env":
        token = os.environ.get(value)
        if not token:
            raise TokenReferenceError(f"environment variable {value} is not set")
        return _checked_digest(token, f"environment variable {value}")
    if scheme == "file":
        path = Path(value).expanduser()
        if not path.is_absolute():
            path = base_dir / path
        return _checked_digest(_read_private_file(path), f"file {path}")
    raise TokenReferenceError("a token reference is 'env:VAR', 'file:PATH' or 'sha256:HEX'")


def _read_private_file(path: Path) -> str:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise TokenFileMissingError(f"token file {path} does not exist yet") from None
    except OSError as e:
        raise TokenReferenceError(f"cannot read token file {path}: {e.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TokenReferenceError(
            f"token file {path} is accessible by group or others (mode {stat.S_IMODE(mode):o}); chmod 600 it"
        )
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise TokenReferenceError(f"cannot read token file {path}: {type(e).__name__}") from None


def _checked_digest(token: str, where: str) -> bytes:
    if len(token) < _MIN_TOKEN_CHARS:
        raise TokenReferenceError(f"token from {where} is shorter than {_MIN_TOKEN_CHARS} characters")
    return digest_token(token)
