"""Stopping a gateway with two workers as an operator does, in real processes: Ctrl-C in the
terminal it runs in (SIGINT to the whole foreground process group: the supervisor, its
workers and the limit relay alike), and the files the manual tells the operator about."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, SANDGATE, TOKEN, UPSTREAM_IP, tenant_yaml, write_gateway_files
from support import RecordingUpstream, TestPKI, wait_for_port
from support.processes import alive, wait_until

pytestmark = pytest.mark.slow

TWO = {"SANDGATE_WORKERS": "2"}
# Long enough that a request is still in flight when Ctrl-C comes, short enough for a drain.
UPSTREAM_DELAY = 2.0


@dataclass
class ForegroundGateway:
    """`sandgate run` as a shell runs it in a terminal: the leader of its own process group."""

    root: Path
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def state(self) -> Path:
        return self.root / "state"

    def status(self) -> dict[str, Any] | None:
        try:
            status: dict[str, Any] = json.loads((self.state / "gateway.json").read_text())
        except (OSError, ValueError):
            return None
        return status if status.get("workers") == 2 else None

    def ctrl_c(self) -> None:
        """What the terminal does on Ctrl-C: SIGINT to every process of the foreground group."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def slow_upstream() -> Iterator[RecordingUpstream]:
    with RecordingUpstream(UPSTREAM_IP, name="slow", delay=UPSTREAM_DELAY) as upstream:
        yield upstream


@pytest.fixture
def foreground(tmp_path: Path, pki: TestPKI, slow_upstream: RecordingUpstream) -> Iterator[ForegroundGateway]:
    rules = [{"hosts": ["api.test"], "ports": [slow_upstream.port]}]
    config, port = write_gateway_files(
        tmp_path,
        {"t1.yaml": tenant_yaml("t1", rules)},
        config={
            "upstream": {"trusted_ca": str(pki.ca_file)},
            "log": {"level": "info", "format": "console"},
            "shutdown": {"drain_seconds": 15.0},
        },
    )
    log_path = tmp_path / "gateway.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [SANDGATE, "run", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **TWO},
            start_new_session=True,
        )
    gw = ForegroundGateway(tmp_path, port, proc, log_path)
    try:
        wait_for_port("127.0.0.1", port, timeout=90)
        wait_until(gw.status, "both workers to serve", timeout=60)
        yield gw
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def shutdown_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "gateway.shutdown" in line]


def test_ctrl_c_drains_each_worker_once_and_logs_no_error(
    foreground: ForegroundGateway, slow_upstream: RecordingUpstream
) -> None:
    gw = foreground
    status = gw.status()
    assert status is not None
    answers: list[subprocess.CompletedProcess[str]] = []
    url = f"{slow_upstream.url_for('api.test')}/in-flight"
    proxy = f"http://sb1:{TOKEN}@127.0.0.1:{gw.port}"

    def request() -> None:
        answers.append(
            subprocess.run(
                ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-x", proxy, url],
                capture_output=True,
                text=True,
                timeout=60,
            )
        )

    client = threading.Thread(target=request)
    client.start()
    slow_upstream.wait_for_requests(1, timeout=30)
    gw.ctrl_c()
    assert gw.proc.wait(60) == 0
    client.join(60)
    log = gw.log()
    # The request in flight was drained, not cut: each worker took one signal (the
    # supervisor's), not the terminal's and then the supervisor's (a second one cuts the drain).
    assert [a.stdout for a in answers] == ["200"], (answers, log[-3000:])
    lines = shutdown_lines(log)
    assert len(lines) == 2 and all("ended_by=drained" in line for line in lines), lines
    # The limit relay was not hit by the terminal's signal, and not restarted.
    assert "limit_relay.died" not in log and "limit_relay.restarted" not in log, log[-3000:]
    assert not re.search(r"\[(error|critical)\s*\]", log), log[-3000:]
    for pid in status["worker_pids"]:
        assert not alive(pid), f"worker {pid} outlived the supervisor"


def test_the_manual_names_the_workers_sockets_where_they_are(foreground: ForegroundGateway) -> None:
    """The manual: each worker but the lead serves its admin API on `<state_dir>/workers/w<i>.sock`."""
    for page in ("docs/operations/workers.md", "docs/reference/admin-api.md"):
        text = (REPO / page).read_text()
        assert "`<state_dir>/workers/w<i>/admin.sock`" not in text, page
        assert "`<state_dir>/workers/w<i>.sock`" in text, page
    assert (foreground.state / "workers" / "w1.sock").is_socket()
    assert not (foreground.state / "workers" / "w1" / "admin.sock").exists()
