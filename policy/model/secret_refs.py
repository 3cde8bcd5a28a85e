"""Secret references: `scheme:value` text, parsed and checked for syntax (not resolved)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from sandgate.policy.errors import SecretReferenceError

__all__ = ["SecretRef", "check_ref", "parse_ref"]

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `stored:NAME` names a value of the declaring tenant only: no '/', so no other tenant's entry.
_STORED_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


@dataclass(frozen=True, slots=True)
class SecretRef:
    """A parsed reference: `env:NAME`, `file:PATH`, `cmd:PROGRAM ARGS...`, `stored:NAME`, or another scheme.

    A `stored:` reference is qualified with its tenant (`stored:TENANT/NAME`) when compiled,
    never by the tenant file's author.
    """

    scheme: str
    value: str

    def __str__(self) -> str:
        return f"{self.scheme}:{self.value}"

    def argv(self) -> tuple[str, ...]:
        """The argument vector of a `cmd:` reference (shell-like quoting, never a shell)."""
        return tuple(shlex.split(self.value))

    def relative_to(self, base_dir: Path) -> SecretRef:
        """A `file:` reference with a relative path made absolute against base_dir; others unchanged."""
        if self.scheme != "file":
            return self
        path = Path(self.value).expanduser()
        return SecretRef("file", str(path if path.is_absolute() else base_dir / path))

    def for_tenant(self, tenant: str) -> SecretRef:
        """A `stored:NAME` reference qualified with the declaring tenant; others unchanged."""
        if self.scheme != "stored":
            return self
        return SecretRef("stored", f"{tenant}/{self.value}")


def parse_ref(text: str) -> SecretRef:
    """Parse `scheme:value`, checking the syntax of the built-in schemes."""
    scheme, colon, value = text.partition(":")
    if not colon or not _SCHEME.fullmatch(scheme):
        raise SecretReferenceError("a secret reference is 'scheme:value', e.g. 'env:NAME' or 'file:PATH'")
    if not value or value != value.strip() or "\x00" in value or "\n" in value:
        raise SecretReferenceError(f"{scheme}: reference needs a value without surrounding space")
    if scheme == "env" and not _ENV_NAME.fullmatch(value):
        raise SecretReferenceError("env: needs an environment variable name")
    if scheme == "stored" and not _STORED_NAME.fullmatch(value):
        raise SecretReferenceError(
            "stored: needs a credential name (lower-case letters, digits, '.', '_', '-')"
        )
    if scheme == "cmd":
        try:
            argv = shlex.split(value)
        except ValueError:
            raise SecretReferenceError("cmd: has unbalanced quotes") from None
        if not argv:
            raise SecretReferenceError("cmd: needs a program")
    return SecretRef(scheme, value)


def check_ref(text: str) -> str:
    """Pydantic validator: the reference text if it parses, else ValueError."""
    parse_ref(text)
    return text
