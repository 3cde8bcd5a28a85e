"""`env:NAME`: a secret from the gateway's environment, read at each use."""

from __future__ import annotations

import os
from collections.abc import Mapping

from sandgate.brokers.errors import SecretUnavailable
from sandgate.brokers.secret import Secret
from sandgate.policy.model.secret_refs import SecretRef

__all__ = ["EnvSource"]


class EnvSource:
    """Reads `os.environ` (or a given mapping) on every `get`; a missing or empty variable is unavailable."""

    __slots__ = ("_environ",)

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ

    async def get(self, ref: SecretRef) -> Secret:
        value = self._environ.get(ref.value, "").strip()
        if not value:
            raise SecretUnavailable(f"environment variable {ref.value} is not set or empty")
        return Secret(value)
