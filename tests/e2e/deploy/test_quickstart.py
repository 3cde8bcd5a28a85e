"""deploy/quickstart.sh, run for real on this (installed) machine: a line per phase, its
--config and --port reaching `sandgate run`, and a busy port said in one line.

The install phases find everything present here (tests/run.sh installed it), so each run
costs the CLI calls of the later phases only. State goes to a temporary SANDGATE_HOME.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, SANDGATE, tenant_yaml, write_gateway_files
from support import free_port, wait_for_port

pytestmark = pytest.mark.slow

SCRIPT = REPO / "deploy" / "quickstart.sh"
PHASES = ["system packages", "virtualenv", "demo sandbox token", "gateway CA", "policy check", "starting"]


def env(home: Path) -> dict[str, str]:
    return {**os.environ, "SANDGATE_HOME": str(home)}


def test_a_busy_port_after_every_phase_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [str(SCRIPT), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=180,
            env=env(tmp_path / "home"),
        )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert all(lines[i].startswith(f"quickstart [{i + 1}/6] {PHASES[i]}") for i in range(6)), lines
    assert lines[5] == f"quickstart [6/6] starting: sandgate run --port {port} (Ctrl-C stops it)"
    assert lines[6:] == [
        f"sandgate: proxy listener 127.0.0.1:{port}: port {port} is in use: pass a free one with --port"
    ]
    assert (tmp_path / "home" / "ca" / "mitmproxy-ca-cert.pem").exists(), "the CA phase made the CA"


def test_config_and_port_reach_sandgate_run(tmp_path: Path) -> None:
    config_path, config_port = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [])})
    port = free_port()
    log = tmp_path / "quickstart.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(SCRIPT), "--config", str(config_path), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=env(tmp_path / "unused-home"),
        )
    try:
        wait = subprocess.run(
            [SANDGATE, "status", "--wait", "--timeout", "150", "--config", str(config_path)],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert wait.returncode == 0, (wait.stderr, log.read_text())
        assert f"pid {proc.pid})" in wait.stdout, "the script execs the gateway: same process"
        wait_for_port("127.0.0.1", port)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", config_port), timeout=2).close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    text = log.read_text()
    assert (
        f"quickstart [3/6] sandbox tokens: skipped (the tenant files of {config_path} name their own)" in text
    )
    assert f"quickstart [5/6] policy check ({tmp_path / 'rules'})" in text
    assert f"quickstart [6/6] starting: sandgate run --config {config_path} --port {port}" in text
    assert (tmp_path / "state" / "ca" / "mitmproxy-ca-cert.pem").exists(), "the config's state_dir"
    assert not (tmp_path / "unused-home").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port"], "usage: deploy/quickstart.sh [--config FILE] [--port N]"),
        (["--port", "80x"], "usage: deploy/quickstart.sh [--config FILE] [--port N]"),
        (
            ["--config", "/nonexistent/gateway.yaml"],
            "quickstart: no such config file: /nonexistent/gateway.yaml",
        ),
        (["--verbose"], "usage: deploy/quickstart.sh [--config FILE] [--port N]"),
    ],
    ids=["a port flag without a port", "a port that is no number", "a missing config", "an unknown flag"],
)
def test_bad_arguments_stop_before_any_phase(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=30, env=env(tmp_path / "home")
    )
    assert proc.returncode == 2
    assert proc.stderr == message + "\n"
