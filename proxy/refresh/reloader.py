"""Policy reload: on SIGHUP or a change on disk, load the rules off the event loop and swap.

A failed load keeps the policy in force; the error is logged and audited. A file the
watcher sees changing is loaded only once it has held still for `settle` seconds, and a
load during which any watched file moved is thrown away and tried again: no request is
decided on a policy that never existed on disk as a whole. A tenant file that does not
load (isolated loading) is reported the same way while the other tenants' changes apply.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from sandgate.policy.errors import PolicyLoadError, PolicySetError, SourceLocation
from sandgate.policy.model.policyset import PolicySet, TenantProblem
from sandgate.proxy.audit.records import new_decision_id
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.fleet.channel import ReloadReport
from sandgate.proxy.tasks import BackgroundTask

__all__ = [
    "ConfirmPeers",
    "PolicyReloader",
    "ReloadOutcome",
    "RulesKeptError",
    "problem_view",
    "report_problems",
]

log = structlog.get_logger("sandgate.reload")

Fingerprint = tuple[tuple[str, int, int], ...]

FILE_CHANGE = "file_change"
WATCH_BACKOFF = 20
# Loads tried while files keep moving under them, before the reload counts as failed.
STABLE_LOAD_ATTEMPTS = 5

# The lead of several workers: (trigger, whether its own load succeeded) -> each worker's
# result, once every peer loaded the same files (or was named as not confirming).
ConfirmPeers = Callable[[str, bool], Awaitable[list[dict[str, object]]]]


class RulesKeptError(PolicySetError):
    """The policy files did not load, but the sandbox registry changed: `policy` is the new
    registry merged onto the rules in force. Registry changes never wait for files to load."""

    def __init__(self, policy: PolicySet, cause: PolicySetError) -> None:
        super().__init__(cause.errors)
        self.policy = policy


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """The last reload attempt, for the admin API's status (errors are file:line texts)."""

    ok: bool
    trigger: str
    time: float
    policy_version: str
    errors: tuple[str, ...] = ()
    # Tenant files that did not load while the rest did.
    problems: tuple[TenantProblem, ...] = ()


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
        settle: float = 1.0,
        on_reload: Callable[[PolicySet], None] | None = None,
        audit: bool = True,
    ) -> None:
        self.ctx = ctx
        self.load = load
        self.watched = watched
        self.watch = watch
        self.interval = interval
        self.settle = settle
        self.on_reload = on_reload
        # False on workers other than the lead: every worker loads the same files on the same
        # triggers, so the gateway's one trail records each reload once (the lead's); a
        # peer's outcome is in its log and in the lead's admin answer.
        self.audit = audit
        # Set on the lead of several workers: a change seen on disk or a SIGHUP is recorded
        # only once every peer has it in force too, so a record means the whole gateway.
        self.confirm_peers: ConfirmPeers | None = None
        # What each worker said to the last reload the lead confirmed with its peers.
        self.last_workers: list[dict[str, object]] | None = None
        self._lock = asyncio.Lock()
        self._task = BackgroundTask("sandgate-policy-watch", self._watch)
        self._fingerprint: Fingerprint = ()
        self.failures = 0
        self.last: ReloadOutcome | None = None

    async def start(self) -> None:
        self._fingerprint = await asyncio.to_thread(lambda: _fingerprint(self.watched(self.ctx.policy)))
        if self.watch:
            self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def reload(self, trigger: str, *, with_peers: bool = False) -> bool:
        """Load and swap; True when the new policy is in force. `with_peers`: on the lead of
        several workers, the record waits for every peer to load the same files."""
        async with self._lock:
            return await self._reload_locked(trigger, with_peers=with_peers)

    async def reload_if_changed(self, trigger: str) -> bool:
        """Load unless the files in force are the ones on disk (a peer the lead asks after a
        change both saw: its own watcher or SIGHUP may have loaded it already)."""
        async with self._lock:
            current = await asyncio.to_thread(lambda: _fingerprint(self.watched(self.ctx.policy)))
            if current == self._fingerprint:
                return self.last is None or self.last.ok
            return await self._reload_locked(trigger)

    async def _reload_locked(self, trigger: str, *, with_peers: bool = False) -> bool:
        old = self.ctx.policy.version
        try:
            policy = await self._stable_load()
        except RulesKeptError as e:
            if e.policy.version != old:
                self.ctx.policy = e.policy
                log.warning("policy.registry_applied_on_kept_rules", version=e.policy.version)
            kept = [str(x) for x in e.errors]
            await self._failed(trigger, old, kept, served=e.policy.version, with_peers=with_peers)
            return False
        except PolicyLoadError as e:
            errors = e.errors if isinstance(e, PolicySetError) else (e,)
            await self._failed(trigger, old, [str(x) for x in errors], with_peers=with_peers)
            return False
        except Exception as e:
            log.exception("policy.reload_failed", trigger=trigger, kept_version=old)
            await self._failed(trigger, old, [type(e).__name__], with_peers=with_peers)
            return False
        self.ctx.policy = policy
        self.last = ReloadOutcome(True, trigger, time.time(), policy.version, problems=policy.problems)
        if self.on_reload is not None:
            self.on_reload(policy)
        log.info(
            "policy.reloaded",
            trigger=trigger,
            old_version=old,
            version=policy.version,
            tenants=len(policy.tenants),
        )
        report_problems(policy)
        workers = await self._peers_confirm(trigger, True, with_peers)
        if self.audit:
            record = self._record(trigger, "ok", old, policy.version, [], policy.problems)
            await self.ctx.audit.emit(self._with_workers(record, workers))
        return True

    async def _peers_confirm(
        self, trigger: str, ok: bool, with_peers: bool
    ) -> list[dict[str, object]] | None:
        if not with_peers or self.confirm_peers is None:
            return None
        try:
            workers = await self.confirm_peers(trigger, ok)
        except Exception:
            log.exception("policy.peer_reload_failed", trigger=trigger)
            workers = [{"ok": False, "error": "the other workers could not be asked"}]
        self.last_workers = workers
        return workers

    @staticmethod
    def _with_workers(
        record: dict[str, object], workers: list[dict[str, object]] | None
    ) -> dict[str, object]:
        if workers is not None:
            record["workers"] = workers
        return record

    def report(self) -> ReloadReport | None:
        """The last reload as the fleet sees it (None before the first)."""
        last = self.last
        if last is None:
            return None
        return ReloadReport(last.ok, last.errors, tuple(p.file for p in last.problems))

    async def record_start(self) -> None:
        """Audit the problems of the policy the gateway started with (the log has them already)."""
        policy = self.ctx.policy
        if policy.problems and self.audit:
            record = self._record("start", "ok", "", policy.version, [], policy.problems)
            await self.ctx.audit.emit(record)

    async def _stable_load(self) -> PolicySet:
        """Load; when a watched file moved while it was read, wait `settle` and load again.

        Whatever the trigger, the files' fingerprint is recorded once they were read whole
        (loaded or refused): the watcher then does not load the same change a second time."""
        for _ in range(STABLE_LOAD_ATTEMPTS):
            files = self.watched(self.ctx.policy)
            before = await asyncio.to_thread(_fingerprint, files)
            try:
                policy = await asyncio.to_thread(self.load)
            except Exception:
                if await asyncio.to_thread(_fingerprint, files) == before:
                    self._fingerprint = before
                raise
            if await asyncio.to_thread(_fingerprint, files) == before:
                # What the watcher compares next: the files the new policy watches (a new token file).
                self._fingerprint = await asyncio.to_thread(_fingerprint, self.watched(policy))
                return policy
            log.info("policy.files_moved_during_load", retry_in=self.settle)
            await asyncio.sleep(self.settle)
        raise PolicyLoadError(
            SourceLocation("rules"),
            "",
            "the policy files kept changing while they were read; write them atomically",
        )

    async def _failed(
        self,
        trigger: str,
        old: str,
        errors: list[str],
        served: str | None = None,
        *,
        with_peers: bool = False,
    ) -> None:
        """A refused load: the rules in force stay (`served`: with a new registry merged in)."""
        served = served or old
        self.failures += 1
        log.error("policy.reload_failed", trigger=trigger, kept_version=old, errors=errors)
        self.last = ReloadOutcome(False, trigger, time.time(), served, tuple(errors))
        # The peers load the same files even so: each keeps or replaces its policy as its load decides.
        workers = await self._peers_confirm(trigger, False, with_peers)
        if self.audit:
            record = self._record(trigger, "error", old, served, errors)
            await self.ctx.audit.emit(self._with_workers(record, workers))

    async def _watch(self) -> None:
        pause = self.interval
        seen, seen_since = self._fingerprint, time.monotonic()
        while True:
            await asyncio.sleep(pause)
            try:
                started = time.monotonic()
                current = await asyncio.to_thread(lambda: _fingerprint(self.watched(self.ctx.policy)))
                # Checking thousands of files holds the GIL the proxy needs: keep the watcher
                # under ~5 % of a core by waiting at least 20 times as long as a check took.
                pause = max(self.interval, (time.monotonic() - started) * WATCH_BACKOFF)
                if current != seen:
                    # Still being written, perhaps: look again once it could have settled.
                    seen, seen_since = current, time.monotonic()
                    pause = min(pause, max(self.settle, 0.05))
                    continue
                if current != self._fingerprint and time.monotonic() - seen_since >= self.settle:
                    async with self._lock:
                        # Unless an explicit reload (SIGHUP, the admin API) loaded them meanwhile.
                        if current != self._fingerprint:
                            await self._reload_locked(FILE_CHANGE, with_peers=True)
            except Exception:
                log.exception("policy.watch_failed")

    @staticmethod
    def _record(
        trigger: str,
        result: str,
        old: str,
        new: str,
        errors: list[str],
        problems: tuple[TenantProblem, ...] = (),
    ) -> dict[str, object]:
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
            "tenant_errors": [problem_view(p) for p in problems],
        }


def problem_view(problem: TenantProblem) -> dict[str, object]:
    """A tenant file's load problem as JSON (status API, audit, status file)."""
    return {
        "file": problem.file,
        "tenant": problem.tenant,
        "kept_last_good": problem.kept_last_good,
        "errors": list(problem.errors),
    }


def report_problems(policy: PolicySet) -> None:
    """Log each tenant file that did not load and each notice of a loaded policy."""
    for p in policy.problems:
        log.error(
            "policy.tenant_load_failed",
            file=p.file,
            tenant=p.tenant,
            serving="last good version" if p.kept_last_good else "nothing (no_identity)",
            errors=list(p.errors),
        )
    for notice in policy.notices:
        log.warning("policy.notice", notice=str(notice))
