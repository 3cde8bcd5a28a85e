"""The workers' limit relay: a private redis-server on a unix socket that a gateway's workers
share for their limit counts.

With workers > 1 and no `redis:` configured, the supervisor starts one (`LimitRelay(folder)`)
before it spawns the workers and passes its URL in `SANDGATE_LIMIT_RELAY`; each worker runs
the fleet's LimitSync against it (sandgate.proxy.fleet.limits_sync.relay_limit_sync), so
sandbox and tenant request and byte limits hold for the gateway as a whole. It listens on no
TCP port, only on a socket in a 0700 folder, and keeps nothing on disk. A watchdog thread
restarts it when it dies; the restarted one is empty, so the counts of the current windows
start again from zero (each worker still enforces its own counts meanwhile, and what it sends
from then on is shared again).

It runs in a session of its own: a terminal's Ctrl-C (SIGINT to the foreground process group)
stops the supervisor, not the relay under it. Once the gateway stops (`gateway_stopping()`),
an exit of the relay is expected (systemd's stop signals every process of the unit): it is
logged as such and not restarted.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import redis
import structlog

from sandgate.proxy.errors import ConfigError

__all__ = ["LimitRelay", "LimitRelayError"]

log = structlog.get_logger("sandgate.limit_relay")

SOCKET_NAME = "limits.sock"
# sockaddr_un.sun_path is 108 bytes on Linux, the terminating NUL included.
MAX_SOCKET_PATH = 107
START_TIMEOUT = 10.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
RESTART_BACKOFF_MIN, RESTART_BACKOFF_MAX = 0.1, 5.0


class LimitRelayError(ConfigError):
    """The limit relay cannot be started (redis-server missing, socket path too long, no answer)."""


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent thread ends (prctl PR_SET_PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


class LimitRelay:
    """One private redis-server on `<folder>/limits.sock`, restarted by a watchdog if it dies."""

    def __init__(self, folder: Path, *, binary: str | None = None) -> None:
        self.folder = folder
        self.socket = folder / SOCKET_NAME
        self.binary = binary or shutil.which("redis-server")
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        # Set when the gateway stops: an exit from then on is no fault to repair.
        self._gateway_stopping = threading.Event()
        self._lock = threading.Lock()
        self._watchdog: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def start(self) -> LimitRelay:
        """Start redis-server and wait until it answers (LimitRelayError when it cannot)."""
        if self.binary is None:
            raise LimitRelayError(
                "workers > 1 need redis-server for shared limits; install it "
                "(deploy/install.sh, or apt-get install redis-server) or set workers: 1"
            )
        if len(os.fsencode(self.socket)) > MAX_SOCKET_PATH:
            raise LimitRelayError(
                f"limit relay socket {self.socket}: longer than {MAX_SOCKET_PATH} bytes; "
                "use a shorter state_dir"
            )
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.folder, 0o700)
        self._stopping.clear()
        self._stop_stale()
        with self._lock:
            self._spawn()
        self._watchdog = threading.Thread(target=self._watch, name="sandgate-limit-relay", daemon=True)
        self._watchdog.start()
        log.info("limit_relay.started", socket=str(self.socket), pid=self.pid)
        return self

    def gateway_stopping(self) -> None:
        """The gateway stops (its workers drain): keep serving them, but if the server exits
        now, it is not restarted (a signal meant for the whole gateway reached it too)."""
        self._gateway_stopping.set()

    def stop(self) -> None:
        """Stop the watchdog and the server; the socket file goes with it."""
        self._stopping.set()
        with self._lock:
            process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=5)
        self._watchdog = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    def __enter__(self) -> LimitRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self) -> None:
        """Start the process (under the lock) and wait until it answers PING."""
        assert self.binary is not None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()  # a previous one's, dead: redis-server would not bind over it
        self._process = subprocess.Popen(
            [
                self.binary,
                "--port", "0",
                "--unixsocket", str(self.socket),
                "--unixsocketperm", "700",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.folder),
                "--loglevel", "warning",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            # Signals reach it from this process only: see the module's docstring.
            start_new_session=True,
            # It dies with the thread that started it (the supervisor's, or this watchdog's),
            # even when the supervisor is killed with SIGKILL: no relay outlives its gateway.
            preexec_fn=_die_with_parent,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while not self._answers():
            if self._process.poll() is not None:
                err = self._process.stderr.read() if self._process.stderr else b""
                raise LimitRelayError(
                    f"limit relay (redis-server) exited at start ({self._process.returncode}): "
                    + err.decode(errors="replace").strip()[-300:]
                )
            if time.monotonic() > deadline:
                self._process.kill()
                raise LimitRelayError(f"limit relay did not answer on {self.socket} in {START_TIMEOUT:g} s")
            time.sleep(0.01)
        # Nothing more is read from its stderr: a full pipe must not block it.
        if self._process.stderr is not None:
            self._process.stderr.close()

    def _stop_stale(self) -> None:
        """A relay left by a supervisor that was killed (SIGKILL) still answers here: stop it.
        Its folder is private to this state_dir, so what answers on its socket is ours."""
        if not self._answers():
            return
        client = redis.Redis(unix_socket_path=str(self.socket), socket_timeout=2)
        try:
            pid = int(client.info("server")["process_id"])
        except (redis.RedisError, KeyError, ValueError):
            return
        finally:
            client.close()
        # SIGTERM: SHUTDOWN over the socket takes seconds to return on redis 7.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while self._answers() and time.monotonic() < deadline:
            time.sleep(0.01)
        log.warning("limit_relay.stale_stopped", socket=str(self.socket), pid=pid)

    def _answers(self) -> bool:
        if not self.socket.exists():
            return False
        client = redis.Redis(
            unix_socket_path=str(self.socket), socket_timeout=0.5, socket_connect_timeout=0.5
        )
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _watch(self) -> None:
        """Restart the server whenever it exits, until stop() (with backoff while it keeps failing)."""
        backoff = RESTART_BACKOFF_MIN
        while not self._stopping.is_set():
            process = self._process
            if process is None:
                return
            code = process.wait()
            if self._stopping.is_set():
                return
            if self._gateway_stopping.is_set():
                log.info("limit_relay.exited", code=code, reason="the gateway stops")
                return
            log.error(
                "limit_relay.died",
                code=code,
                consequence="restarted empty: shared limit counts of the current windows start again",
            )
            while not self._stopping.wait(backoff):
                try:
                    with self._lock:
                        if self._stopping.is_set():
                            return
                        self._spawn()
                except (LimitRelayError, OSError) as e:
                    backoff = min(backoff * 2, RESTART_BACKOFF_MAX)
                    log.error("limit_relay.restart_failed", error=str(e), retry_in=backoff)
                    continue
                self.restarts += 1
                backoff = RESTART_BACKOFF_MIN
                log.warning("limit_relay.restarted", pid=self.pid, restarts=self.restarts)
                break
