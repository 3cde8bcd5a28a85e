"""The courier: a one-process gateway's SIEM sinks delivered by a process of their own.

A gateway of one process decides on its event loop, and delivery (records mapped to OCSF,
encoded, sent over TLS or HTTP) would hold the same interpreter lock: four live sinks cost
that process about 41 % more CPU per request (bench/audit_sinks.py). So the gateway only
appends to each sink's disk queue (queue.py: the two sides may be two processes) and this
child process reads the queues and delivers, at least once, as the supervisor does itself
for a gateway of several workers (the supervisor decides nothing).

`Courier` is the gateway's side: an AuditSink of the trail that writes nothing, started and
closed with it, which restarts a courier that exits (backoff up to 30 s) and ends it at
close (SIGTERM: it sends what is queued for a moment). The child gets the gateway's config
pickled on its stdin, loads the sinks' credentials itself, ignores SIGINT (the gateway says
when it ends) and ends with the gateway should the gateway die (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import subprocess
import sys
import threading

import structlog

from sandgate.proxy.audit.sinks.build import build_sinks
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.startup.logsetup import configure_logging

__all__ = ["Courier", "main"]

log = structlog.get_logger("sandgate.audit")

_MODULE = "sandgate.proxy.audit.sinks.courier"
_FIRST_DELAY, _MAX_DELAY = 0.5, 30.0
_STOP_WAIT = 5.0  # seconds the courier gets at close (it drains for 2) before it is killed
_PR_SET_PDEATHSIG = 1


class Courier:
    """The courier process of a one-process gateway's sinks, kept running until `close`."""

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()  # the process, between the watcher and close
        self._watcher: threading.Thread | None = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._keep_running, name="sandgate-courier", daemon=True)
            self._watcher.start()

    def write(self, lines: list[str]) -> None:
        """Nothing: the sinks' queues took the batch, which the courier reads from disk."""

    def _spawn(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", _MODULE], stdin=subprocess.PIPE)
        assert proc.stdin is not None
        with proc.stdin:
            proc.stdin.write(pickle.dumps(self._config))
        self.starts += 1
        return proc

    def _keep_running(self) -> None:
        delay = _FIRST_DELAY
        while not self._closed.is_set():
            with self._lock:
                if self._closed.is_set():
                    return
                try:
                    self._proc = proc = self._spawn()
                except OSError as e:
                    log.error("audit.courier_unstarted", error=e.strerror, retry_in=delay)
                    proc = None
            if proc is not None:
                code = proc.wait()
                if self._closed.is_set():
                    return
                log.error("audit.courier_exited", code=code, restart_in=delay)
            self._closed.wait(delay)
            delay = min(delay * 2, _MAX_DELAY)

    def close(self) -> None:
        """End the courier (what it could not send in its drain is sent by the next run)."""
        with self._lock:
            self._closed.set()
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(_STOP_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _end_with_parent() -> None:
    """Have the kernel send SIGTERM should the gateway die first (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the parent check in main() ends it within a second instead


def main() -> int:
    config = pickle.load(sys.stdin.buffer)  # noqa: S301 (from the gateway that started this process)
    if not isinstance(config, GatewayConfig):
        return 2
    parent = os.getppid()
    _end_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    configure_logging(config.log.level, config.log.format)
    sinks = build_sinks(config, side="reader")
    for sink in sinks:
        sink.start()
    while not stop.wait(1.0):
        if os.getppid() != parent:
            break  # the gateway is gone
    for sink in sinks:
        sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
