"""The supervisor: N gateway processes started, kept up, signalled and drained as one gateway.

It serves no traffic and imports no mitmproxy. Each worker is `sandgate run` again with
`SANDGATE_WORKER=i/N`; it dies with the supervisor (proxy/workers/child.py). A worker that
exits on its own after it served is restarted (after a backoff that doubles while it keeps
dying young); one that fails before it served `workers.start_attempts` times in a row (a port
it cannot bind), or reports an invalid policy or config (exit 2), stops the whole gateway
with its one-line reason and its exit code. SIGHUP goes to every worker (each reloads);
SIGTERM/SIGINT go to every worker, which drain and exit, and the supervisor exits 0 once they
are gone (killing what is still there after shutdown.drain_seconds + workers.stop_margin_seconds);
a second signal is forwarded too (a worker then cuts its drain short). Each worker runs in a
session of its own, so that a terminal's Ctrl-C (SIGINT to the whole foreground process group)
reaches it once, forwarded, not twice (which would cut its drain short at once).

Once every worker serves, the supervisor prints the gateway's one start-up block (the lead's
rows under the supervisor's pid: proxy/startup/banner.py) and writes `<state_dir>/gateway.json`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.startup import banner
from sandgate.proxy.state.statusfile import remove_status
from sandgate.proxy.tasks import TaskSet
from sandgate.proxy.worker_role import ENV, WorkerRole
from sandgate.proxy.workers.child import PARENT_ENV, failure_path
from sandgate.proxy.workers.gateway_status import GatewayStatus, worker_status

__all__ = ["Supervisor", "WorkerSlot"]

log = structlog.get_logger("sandgate.workers")

EXIT_FAILED, EXIT_USAGE = 1, 2
# A worker that served at least this long before it died restarts after the base backoff again.
_HEALTHY_SECONDS = 30.0
_POLL_SECONDS = 0.1
_SETTLE_SECONDS = 2.0


@dataclass
class WorkerSlot:
    """One worker index and the process currently filling it."""

    role: WorkerRole
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    ready: bool = False
    restarts: int = 0
    failed_starts: int = 0
    streak: int = 0  # deaths in a row, each young: the backoff doubles with it
    # A SIGHUP that came while this worker was starting: sent once it serves (before its
    # handler is set, SIGHUP's default action would kill it; a reload it missed is still due).
    hangup_due: bool = False
    pids: list[int] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


class Supervisor:
    """Runs `count` workers of `config`'s gateway with `argv` (the worker command line)."""

    def __init__(
        self,
        config: GatewayConfig,
        count: int,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        settle: Callable[[], object] | None = None,
        stopping: Callable[[], object] | None = None,
    ) -> None:
        self.config = config
        # Told at the first SIGTERM/SIGINT: the shared services may go from then on.
        self._stopping = stopping or (lambda: None)
        # Writes what dead processes left (spools, open intents) to the trail: after a worker
        # exits, every few seconds (an earlier gateway's orphaned workers finish), at the end.
        self._settle = settle or (lambda: None)
        self.argv = list(argv)
        self.env = dict(env if env is not None else os.environ)
        self.slots = [WorkerSlot(WorkerRole(i, count)) for i in range(count)]
        self.status = GatewayStatus(config.status_path)
        self.exit_code = 0
        self.failure: str | None = None
        self._stop = asyncio.Event()
        self._signals = 0
        # The lead's status file (identity, size, mtime) and the pids, as last written out.
        self._status_seen: tuple[int, ...] | None = None

    @property
    def restarts(self) -> int:
        return sum(slot.restarts for slot in self.slots)

    async def run(self, *, signals: bool = True) -> int:
        """Start the workers, keep them up until a signal or a failed start; the exit code."""
        loop = asyncio.get_running_loop()
        if signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.terminate, sig)
            loop.add_signal_handler(signal.SIGHUP, self.hangup)
        log.info("workers.starting", workers=len(self.slots), supervisor=os.getpid())
        tasks = TaskSet()
        for slot in self.slots:
            tasks.spawn(self._keep(slot), name=f"sandgate-worker-{slot.role.index}")
        tasks.spawn(self._watch(), name="sandgate-workers-status")
        try:
            await self._stop.wait()
            await self._wait_gone()
            self._settle()
        finally:
            await tasks.cancel()
            if signals:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    loop.remove_signal_handler(sig)
            remove_status(self.config.status_path)
        if self.failure is not None:
            print(f"sandgate: {self.failure}", file=sys.stderr, flush=True)
        log.info("workers.stopped", exit_code=self.exit_code, restarts=self.restarts)
        return self.exit_code

    def hangup(self) -> None:
        """SIGHUP: every worker reloads its policy (one still starting, once it serves)."""
        for slot in self.slots:
            if slot.ready:
                self._signal(slot, signal.SIGHUP)
            else:
                slot.hangup_due = True

    def terminate(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """SIGTERM/SIGINT: forward (a worker drains, then exits); again: forward again (cut now)."""
        self._signals += 1
        if self._signals == 1:
            log.info("workers.stopping", signal=sig.name)
            self._stopping()
        self._stop.set()
        self._forward(sig)

    def _forward(self, sig: signal.Signals) -> None:
        for slot in self.slots:
            self._signal(slot, sig)

    @staticmethod
    def _signal(slot: WorkerSlot, sig: signal.Signals) -> None:
        if slot.alive and slot.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                slot.proc.send_signal(sig)

    def _give_up(self, slot: WorkerSlot, code: int, reason: str | None) -> None:
        """A worker cannot start: stop every worker; exit with its code and reason."""
        if self._stop.is_set():
            return
        self.exit_code = code if code > 0 else EXIT_FAILED
        self.failure = reason
        log.error("workers.start_failed", worker=slot.role.index, exit_code=code, reason=reason)
        self._stop.set()
        self._forward(signal.SIGTERM)

    async def _start(self, slot: WorkerSlot) -> asyncio.subprocess.Process:
        folder = slot.role.folder(self.config.state_path)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        failure_path(folder).unlink(missing_ok=True)
        (folder / banner.BANNER_FILE).unlink(missing_ok=True)
        env = {**self.env, ENV: slot.role.label(), PARENT_ENV: str(os.getpid())}
        # Its own session: signals reach it from this process only (see the module's docstring).
        proc = await asyncio.create_subprocess_exec(*self.argv, env=env, start_new_session=True)
        slot.proc, slot.started, slot.ready = proc, time.monotonic(), False
        if self._stop.is_set():
            # The stop came while it was being started: it missed the forwarded signal.
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        slot.pids.append(proc.pid)
        log.info("worker.started", worker=slot.role.index, pid=proc.pid, restarts=slot.restarts)
        return proc

    async def _keep(self, slot: WorkerSlot) -> None:
        """Run one worker until the gateway stops: restart it when it dies."""
        cfg = self.config.workers
        while not self._stop.is_set():
            proc = await self._start(slot)
            code = await proc.wait()
            # Before its replacement starts: what it let go upstream unrecorded is written now.
            self._settle()
            if self._stop.is_set():
                return
            lived = time.monotonic() - slot.started
            if not slot.ready:
                slot.failed_starts += 1
                reason = self._start_failure(slot, code)
                if code == EXIT_USAGE or slot.failed_starts >= cfg.start_attempts:
                    # Exit 2 (invalid policy or config): the worker said why on stderr already.
                    self._give_up(slot, code, None if code == EXIT_USAGE else reason)
                    return
            else:
                slot.failed_starts = 0
            slot.streak = 0 if lived >= _HEALTHY_SECONDS else slot.streak + 1
            delay = min(cfg.max_backoff_seconds, cfg.restart_backoff_seconds * 2 ** max(0, slot.streak - 1))
            slot.restarts += 1
            log.warning(
                "worker.exited",
                worker=slot.role.index,
                pid=proc.pid,
                exit_code=code,
                served=slot.ready,
                restart_in=round(delay, 2),
                restarts=slot.restarts,
            )
            slot.ready = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)

    def _start_failure(self, slot: WorkerSlot, code: int) -> str:
        """The worker's own line for a failed start, else what its exit says."""
        try:
            line = failure_path(slot.role.folder(self.config.state_path)).read_text().strip()
        except OSError:
            line = ""
        if line:
            return line
        how = f"signal {-code}" if code < 0 else f"code {code}"
        return f"worker {slot.role.index} exited with {how} before it served"

    async def _watch(self) -> None:
        """Mark workers ready as their status files appear; keep the gateway's status current;
        settle what dead processes left every _SETTLE_SECONDS."""
        settled = time.monotonic()
        while True:
            if time.monotonic() - settled >= _SETTLE_SECONDS:
                self._settle()
                settled = time.monotonic()
            for slot in self.slots:
                if slot.alive and not slot.ready and slot.proc is not None:
                    path = slot.role.folder(self.config.state_path) / self.config.status_path.name
                    if worker_status(path, slot.proc.pid) is not None:
                        slot.ready = True
                        log.info("worker.ready", worker=slot.role.index, pid=slot.proc.pid)
                        if slot.hangup_due:
                            slot.hangup_due = False
                            self._signal(slot, signal.SIGHUP)
            self._write_status()
            await asyncio.sleep(_POLL_SECONDS)

    def _write_status(self) -> None:
        if self._stop.is_set():
            return
        lead = self.slots[0]
        if not (self.status.written or all(slot.ready for slot in self.slots)):
            return  # the gateway is ready once every worker is
        if not lead.ready or lead.proc is None:
            return
        path = lead.role.folder(self.config.state_path) / self.config.status_path.name
        pids = [slot.proc.pid for slot in self.slots if slot.proc is not None]
        # Polled ten times a second: the lead's file is read again only once it changed.
        seen = _file_key(path, pids)
        if seen is not None and seen == self._status_seen:
            return
        status = worker_status(path, lead.proc.pid)
        if status is None:
            return
        first = not self.status.written
        changed = self.status.update(status, pids)
        self._status_seen = seen  # after the write: a failed one is tried again next time
        if changed and first:
            log.info("workers.ready", workers=len(self.slots), pids=pids)
            self._announce(pids)

    def _announce(self, pids: list[int]) -> None:
        """The gateway's one start-up block, as one gateway process prints its own."""
        if not banner.show_block(self.config.log.format, sys.stderr):
            return
        rows = self.slots[0].role.folder(self.config.state_path) / banner.BANNER_FILE
        text = banner.supervisor_block(rows, os.getpid(), pids)
        if text is not None:
            sys.stderr.write("\n" + text + "\n")
            sys.stderr.flush()

    async def _wait_gone(self) -> None:
        """Wait for every worker to exit (drained); kill what is left after the drain's time."""
        timeout = self.config.shutdown.drain_seconds + self.config.workers.stop_margin_seconds
        procs = [slot.proc for slot in self.slots if slot.proc is not None]
        if not procs:
            return
        waits = TaskSet()
        tasks = [waits.spawn(proc.wait(), name="sandgate-worker-wait") for proc in procs]
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        if pending:
            for proc in procs:
                if proc.returncode is None:
                    log.error("worker.killed", pid=proc.pid, after_seconds=timeout)
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            await asyncio.wait(tasks)


def _file_key(path: Path, pids: list[int]) -> tuple[int, ...] | None:
    """What tells a rewritten file from the one read before (None: no file)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, *pids)
