"""`cmd:PROGRAM ARGS...`: a secret printed by a command (a vault CLI), run without a shell, kept for a TTL."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sandgate.brokers.errors import SecretUnavailable
from sandgate.brokers.secret import Secret
from sandgate.policy.model.secret_refs import SecretRef

__all__ = ["CommandSource"]

MAX_OUTPUT_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class _Cached:
    secret: Secret
    expires: float


class CommandSource:
    """Runs the command with a timeout; its stripped stdout is the secret, kept for `ttl` seconds.

    The command's output is never echoed: a failure says only which program and how it failed
    (exit status, timeout, empty output). Concurrent `get`s of one reference share one run.
    """

    __slots__ = ("_cache", "_clock", "_env", "_locks", "timeout", "ttl")

    def __init__(
        self,
        *,
        ttl: float = 60.0,
        timeout: float = 10.0,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.timeout = timeout
        self._env = dict(env) if env is not None else None
        self._clock = clock
        self._cache: dict[str, _Cached] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, ref: SecretRef) -> Secret:
        key = ref.value
        cached = self._cache.get(key)
        if cached is not None and self._clock() < cached.expires:
            return cached.secret
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            cached = self._cache.get(key)
            if cached is not None and self._clock() < cached.expires:
                return cached.secret
            secret = await self._run(ref)
            if self.ttl > 0:
                self._cache[key] = _Cached(secret, self._clock() + self.ttl)
            return secret

    async def _run(self, ref: SecretRef) -> Secret:
        argv = ref.argv()
        program = argv[0]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                env=self._env,
            )
        except OSError as e:
            raise SecretUnavailable(f"secret command {program} cannot be started: {e.strerror}") from None
        try:
            async with asyncio.timeout(self.timeout):
                out = await _read_capped(proc, program)
                status = await proc.wait()
        except TimeoutError:
            raise SecretUnavailable(f"secret command {program} timed out after {self.timeout:g}s") from None
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                # wait() returns only once stdout is closed: a pipe paused with unread output
                # (refused as too much) never is unless it is read to its end.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5):
                        while proc.stdout is not None and await proc.stdout.read(1 << 16):
                            pass
                await proc.wait()
        if status != 0:
            raise SecretUnavailable(f"secret command {program} exited with status {status}")
        value = out.strip()
        if not value:
            raise SecretUnavailable(f"secret command {program} printed nothing")
        return Secret(value)


async def _read_capped(proc: asyncio.subprocess.Process, program: str) -> bytes:
    """All of the command's stdout, refusing more than MAX_OUTPUT_BYTES."""
    assert proc.stdout is not None
    chunks: list[bytes] = []
    total = 0
    while chunk := await proc.stdout.read(1 << 16):
        total += len(chunk)
        if total > MAX_OUTPUT_BYTES:
            raise SecretUnavailable(f"secret command {program} printed more than {MAX_OUTPUT_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
