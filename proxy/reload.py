"""Policy reload: on SIGHUP or a change on disk, load the rules off the event loop and swap.

A failed load keeps the policy in force; the error is logged and audited.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from sandgate.policy.errors import PolicyLoadError, PolicySetError
from sandgate.policy.policyset import PolicySet

from .context import GatewayContext
from .records import new_decision_id

__all__ = ["PolicyReloader", "ReloadOutcome"]

log = structlog.get_logger("sandgate.reload")

Fingerprint = tuple[tuple[str, int, int], ...]

WATCH_BACKOFF = 20


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """The last reload attempt, for the admin API's status (errors are file:line texts)."""

    ok: bool
    trigger: str
    time: float
    policy_version: str
    errors: tuple[str, ...] = ()


def _fingerprint(files: list[Path]) -> Fingerprint:
    out = []
    for p in files:
        try:
            st = p.stat()
        except OSError:
            out.append((str(p), -1, -1))
            continue
        out.append((str(p), st.st_mtime_ns, st.st_size))
    return tuple(out)


class PolicyReloader:
    """Reloads the policy into the gateway context; one reload at a time.

    `load` builds a complete PolicySet (in a worker thread); `watched` lists the files whose
    change triggers a reload (policy files, token files, the sandbox registry).
    """

    def __init__(
        self,
        ctx: GatewayContext,
        load: Callable[[], PolicySet],
        watched: Callable[[PolicySet], list[Path]],
        *,
        watch: bool,
        interval: float,
        on_reload: Callable[[PolicySet], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.load = load
        self.watched = watched
        self.watch = watch
        self.interval = interval
        self.on_reload = on_reload
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._fingerprint: Fingerprint = ()
        self.failures = 0
        self.last: ReloadOutcome | None = None

    async def start(self) -> None:
        self._fingerprint = await asyncio.to_thread(lambda: _fingerprint(self.watched(self.ctx.policy)))
        if self.watch:
            self._task = asyncio.create_task(self._watch(), name="sandgate-policy-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def reload(self, trigger: str) -> bool:
        """Load and swap; True when the new policy is in force."""
        async with self._lock:
            old = self.ctx.policy.version
            try:
                policy = await asyncio.to_thread(self.load)
            except PolicyLoadError as e:
                self.failures += 1
                errors = e.errors if isinstance(e, PolicySetError) else (e,)
                log.error(
                    "policy.reload_failed",
                    trigger=trigger,
                    kept_version=old,
                    errors=[str(x) for x in errors],
                )
                self.last = ReloadOutcome(False, trigger, time.time(), old, tuple(str(x) for x in errors))
                await self.ctx.audit.emit(self._record(trigger, "error", old, old, [str(x) for x in errors]))
                return False
            except Exception as e:
                self.failures += 1
                log.exception("policy.reload_failed", trigger=trigger, kept_version=old)
                self.last = ReloadOutcome(False, trigger, time.time(), old, (type(e).__name__,))
                await self.ctx.audit.emit(self._record(trigger, "error", old, old, [type(e).__name__]))
                return False
            self.ctx.policy = policy
            self.last = ReloadOutcome(True, trigger, time.time(), policy.version)
            if self.on_reload is not None:
                self.on_reload(policy)
            log.info(
                "policy.reloaded",
                trigger=trigger,
                old_version=old,
                version=policy.version,
                tenants=len(policy.tenants),
            )
            await self.ctx.audit.emit(self._record(trigger, "ok", old, policy.version, []))
            return True

    async def _watch(self) -> None:
        pause = self.interval
        while True:
            await asyncio.sleep(pause)
            try:
                started = time.monotonic()
                current = await asyncio.to_thread(lambda: _fingerprint(self.watched(self.ctx.policy)))
                # Checking thousands of files holds the GIL the proxy needs: keep the watcher
                # under ~5 % of a core by waiting at least 20 times as long as a check took.
                pause = max(self.interval, (time.monotonic() - started) * WATCH_BACKOFF)
                if current != self._fingerprint:
                    self._fingerprint = current
                    await self.reload("file_change")
            except Exception:
                log.exception("policy.watch_failed")

    @staticmethod
    def _record(trigger: str, result: str, old: str, new: str, errors: list[str]) -> dict[str, object]:
        return {
            "event": "policy_reload",
            "v": 1,
            "time": time.time(),
            "decision_id": new_decision_id(),
            "trigger": trigger,
            "result": result,
            "old_version": old,
            "policy_version": new,
            "errors": errors,
        }
