"""One state folder, one gateway, with real `sandgate run` processes: a second gateway on a
folder in use refuses to start (one line naming the folder and the pid holding it) and leaves
the first one as it was; a gateway killed with SIGKILL leaves no lock behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import SANDGATE, GatewayFactory, curl, tenant_yaml
from support import RecordingUpstream, free_port
from support.processes import alive, gateway_status, wait_until

pytestmark = pytest.mark.slow


def broker_pid(state: Path) -> int | None:
    """The pid of the limit relay the supervisor started (redis-server on its socket)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "redis-server" in cmdline and str(state / "workers" / "limits.sock") in cmdline:
            return int(proc.name)
    return None


@pytest.mark.parametrize("workers", ["1", "2"], ids=["a second gateway", "a second gateway with workers"])
def test_a_second_gateway_on_a_state_folder_in_use_refuses_to_start(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, workers: str
) -> None:
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    first = start_gateway({"t1.yaml": tenant_yaml("t1", rules)}, env={"SANDGATE_WORKERS": "2"})
    state = first.root / "state"
    status = wait_until(lambda: gateway_status(first), "both workers to serve")
    broker = broker_pid(state)
    assert broker is not None
    # The same config on another port: only the state folder is shared.
    second = subprocess.run(
        [SANDGATE, "run", "--config", str(first.root / "sandgate.yaml"), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SANDGATE_WORKERS": workers},
    )
    assert second.returncode == 1
    assert second.stderr == (
        f"sandgate: state_dir {state} is in use by the gateway with pid {first.proc.pid} (one gateway "
        "per state folder): stop it (sandgate stop), or give this one a state_dir of its own\n"
    )
    # The first one is as it was: same processes, same broker, same status, and it serves.
    assert json.loads((state / "gateway.json").read_text()) == status
    assert broker_pid(state) == broker and all(alive(pid) for pid in status["worker_pids"])
    url = f"{http_upstream.url_for('api.test')}/x"
    assert curl("-o", "/dev/null", "-w", "%{http_code}", "-x", first.proxy(), url).stdout == "200"
    assert '"limit_relay.stale_stopped"' not in first.log()


def test_a_killed_gateway_leaves_no_lock_behind(start_gateway: GatewayFactory) -> None:
    first = start_gateway({"t1.yaml": tenant_yaml("t1", [])}, env={"SANDGATE_WORKERS": "1"})
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    assert (first.root / "state" / "gateway.lock").exists()
    again = subprocess.Popen(
        [SANDGATE, "run", "--config", str(first.root / "sandgate.yaml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SANDGATE_WORKERS": "1"},
    )
    try:

        def serving() -> bool:
            assert again.poll() is None, "the second start exited"
            status = _status(first.root / "state")
            return status is not None and status["pid"] == again.pid

        wait_until(serving, "the second start to serve")
    finally:
        again.terminate()
        _, err = again.communicate(timeout=30)
    assert again.returncode == 0, err


def _status(state: Path) -> dict[str, object] | None:
    try:
        value: dict[str, object] = json.loads((state / "gateway.json").read_text())
    except (OSError, ValueError):
        return None
    return value
