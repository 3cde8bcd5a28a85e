"""`sandgate stop` against real gateways: it signals the process that stops the gateway (with
workers the supervisor, never a worker, which its supervisor would only start again), waits
until that has exited, and exits 0; with no gateway on the state folder, one line and exit 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SANDGATE, GatewayFactory, tenant_yaml, write_gateway_files
from support.processes import alive, gateway_status, wait_until

pytestmark = pytest.mark.slow


def stop(config_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, "stop", "--config", str(config_path), *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one gateway process", "a supervisor of two workers"])
def test_stop_ends_the_gateway_and_returns_once_it_is_gone(
    start_gateway: GatewayFactory, workers: str
) -> None:
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", [])}, env={"SANDGATE_WORKERS": workers})
    state = gw.root / "state"
    worker_pids: list[int] = []
    if workers == "2":
        worker_pids = wait_until(lambda: gateway_status(gw), "both workers to serve")["worker_pids"]
    proc = stop(gw.root / "sandgate.yaml")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == f"stopped: gateway (pid {gw.proc.pid})\n"
    # Gone when it answered (exited; this test, its parent, has not reaped it yet).
    assert not alive(gw.proc.pid)
    assert gw.proc.wait(5) == 0
    assert not any(alive(pid) for pid in worker_pids), "no worker outlives the stop"
    assert not (state / "gateway.json").exists()
    log = gw.log()
    assert '"level": "error"' not in log and "Traceback" not in log, log[-3000:]
    # Once more: nothing runs on the state folder now.
    again = stop(gw.root / "sandgate.yaml")
    assert (again.returncode, again.stdout) == (1, "")
    assert again.stderr == f"sandgate: no gateway runs with state_dir {state}\n"


def test_stop_without_a_gateway_is_exit_1_with_one_line(tmp_path: Path) -> None:
    config_path, _ = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [])})
    proc = stop(config_path)
    assert proc.returncode == 1
    assert proc.stderr == f"sandgate: no gateway runs with state_dir {tmp_path / 'state'}\n"


def test_a_gateway_that_outlives_the_timeout_is_exit_1(tmp_path: Path) -> None:
    """A process that holds the state folder and ignores SIGTERM: `stop` says it still runs."""
    config_path, _ = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [])})
    script = (
        "import pathlib, signal, sys\n"
        "from sandgate.proxy.state.state_lock import hold\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "hold(pathlib.Path(sys.argv[1]))\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "state")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            proc = stop(config_path, "--timeout", "1")
            assert proc.returncode == 1
            assert proc.stderr == f"sandgate: gateway (pid {holder.pid}) still runs after 1 s\n"
            assert holder.poll() is None
        finally:
            holder.kill()
