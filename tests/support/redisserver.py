"""A real redis-server on loopback for fleet tests: started, killed and restarted on one port."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis

from .ports import free_port, wait_for_port

__all__ = ["RedisServer", "wait_for_presence_since"]


class RedisServer:
    """`redis-server` bound to 127.0.0.1 on a free port, no persistence, in its own folder.

    `kill()` takes it away abruptly (SIGKILL: what a crashed or unreachable redis looks like
    to the gateway); `start()` brings a fresh, empty one back on the same port.
    """

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (deploy/install.sh --dev installs it)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.workdir),
                "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for_port("127.0.0.1", self.port, timeout=10)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_gone(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.02)

    def stream(self, key: str) -> list[dict[bytes, bytes]]:
        """The fields of every entry in the stream `key`, in stream order, as stored (bytes)."""
        client = redis.Redis.from_url(self.url)
        try:
            entries = client.xrange(key)
        finally:
            client.close()
        assert isinstance(entries, list), entries
        return [{_raw(k): _raw(v) for k, v in (fields or {}).items()} for _, fields in entries]

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _raw(value: bytes | str) -> bytes:
    """A redis reply value of a client without `decode_responses`: always bytes."""
    assert isinstance(value, bytes), value
    return value


def wait_for_presence_since(
    url: str, key: str, members: list[str], since: float, timeout: float = 10.0
) -> None:
    """Wait until each of `members` marked itself alive in the sorted set `key` after `since`
    (a `time.time()`): a limit sync scores its mark with the time its round trip started, and
    reads the fleet's totals and presence in that same round trip, so it has seen both."""
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            scores = [client.zscore(key, m) for m in members]
            if all(s is not None and s > since for s in scores):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{key}: no presence mark after {since} from all of {members}: {scores}")
            time.sleep(0.05)
    finally:
        client.close()
