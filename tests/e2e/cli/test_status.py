"""`sandgate status [--wait]` against real gateways: it says "serving" exactly when the
gateway's listeners are bound and /readyz agrees, and one line saying why when not."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SANDGATE, GatewayFactory, tenant_yaml, write_gateway_files
from support import RedisServer, free_port_run
from support.processes import gateway_status, wait_until

pytestmark = pytest.mark.slow


def status(config_path: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, "status", "--config", str(config_path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_no_gateway_is_exit_1_with_one_line(tmp_path: Path) -> None:
    config_path, _ = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [])})
    proc = status(config_path)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == f"sandgate: no gateway answers on {tmp_path / 'state' / 'admin.sock'}\n"


def test_wait_gives_up_at_the_timeout_with_the_reason(tmp_path: Path) -> None:
    config_path, _ = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [])})
    state = tmp_path / "state"
    started = time.monotonic()
    proc = status(config_path, "--wait", "--timeout", "1.5")
    elapsed = time.monotonic() - started
    assert proc.returncode == 1
    assert proc.stderr == (
        f"sandgate: waiting up to 1.5 s for the gateway on state folder {state} "
        f"(the state_dir of --config {config_path})\n"
        f"sandgate: not serving after 1.5 s on state folder {state}: "
        f"no gateway answers on {state / 'admin.sock'}\n"
    )
    assert 1.5 <= elapsed < 30, elapsed  # interpreter start-up included, on a loaded machine


_USE_CONFIG = "; for a gateway started with --config FILE, run status with the same --config FILE"


@pytest.mark.parametrize(
    ("chosen_by", "how"),
    [
        ("home", "(no --config: $SANDGATE_HOME)"),
        ("default", "(no --config: the default ~/.sandgate, $SANDGATE_HOME unset)"),
        ("config", "(--config {config} sets no state_dir: $SANDGATE_HOME)"),
    ],
    ids=[
        "without --config it names the folder $SANDGATE_HOME chose and suggests --config",
        "without --config or $SANDGATE_HOME it names ~/.sandgate and suggests --config",
        "a --config without state_dir names $SANDGATE_HOME's folder and suggests nothing",
    ],
)
def test_wait_names_the_state_folder_it_waits_on(tmp_path: Path, chosen_by: str, how: str) -> None:
    """A gateway started with `--config X` is not found without it: `--wait` says at once
    which state folder it watches (and what chose it), and its time-out names it again."""
    env = {k: v for k, v in os.environ.items() if k != "SANDGATE_HOME"}
    env["HOME"] = str(tmp_path)
    state = tmp_path / ".sandgate"
    if chosen_by != "default":
        state = tmp_path / "home"
        env["SANDGATE_HOME"] = str(state)
    state.mkdir()  # empty: no gateway ever ran on it
    args = ["--wait", "--timeout", "0.5"]
    config_path = tmp_path / "sandgate.yaml"
    if chosen_by == "config":
        config_path.write_text("rules_dir: rules\n")
        args += ["--config", str(config_path)]
    proc = subprocess.run(
        [SANDGATE, "status", *args], capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path
    )
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.splitlines() == [
        f"sandgate: waiting up to 0.5 s for the gateway on state folder {state} "
        + how.format(config=config_path),
        f"sandgate: not serving after 0.5 s on state folder {state}: "
        f"no gateway answers on {state / 'admin.sock'}" + ("" if chosen_by == "config" else _USE_CONFIG),
    ]


def test_wait_returns_once_every_listener_is_bound(tmp_path: Path) -> None:
    """Started before the gateway: exit 0 only when the proxy and DNS listeners accept."""
    config_path, port = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [])})
    dns_port = free_port_run(1, "127.0.0.1")  # free for UDP and TCP
    cfg = yaml.safe_load(config_path.read_text())
    cfg["dns"] = {"host": "127.0.0.1", "port": dns_port}
    config_path.write_text(yaml.safe_dump(cfg))
    waiter = subprocess.Popen(
        [SANDGATE, "status", "--wait", "--timeout", "90", "--config", str(config_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    assert waiter.poll() is None, "nothing serves yet"
    gw = subprocess.Popen([SANDGATE, "run", "--config", str(config_path)], stderr=subprocess.DEVNULL)
    try:
        out, err = waiter.communicate(timeout=90)
        assert waiter.returncode == 0, err
        assert err == (
            f"sandgate: waiting up to 90 s for the gateway on state folder {tmp_path / 'state'} "
            f"(the state_dir of --config {config_path})\n"
        )
        # The moment it said so, the listeners accept.
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        with socket.create_connection(("127.0.0.1", dns_port), timeout=2):
            pass
        lines = out.splitlines()
        assert lines[0] == f"serving: gateway {socket.gethostname()} (pid {gw.pid})"
        assert lines[1] == f"listeners: 127.0.0.1:{port}"
        assert lines[2].startswith("policy version ") and lines[2].endswith(": 1 tenants, 1 sandboxes")
        # The audit trail's signing key (its public half, PEM), then the state folder.
        assert lines[3].startswith("audit signing key: ed25519 ") and lines[4] == "-----BEGIN PUBLIC KEY-----"
        assert lines[6:] == ["-----END PUBLIC KEY-----", f"state folder: {tmp_path / 'state'}"]
        # Once more without --wait, as JSON.
        proc = status(config_path, "--format", "json")
        assert proc.returncode == 0
        body = json.loads(proc.stdout)
        assert body["serving"] is True and body["status"]["pid"] == gw.pid
    finally:
        gw.terminate()
        assert gw.wait(30) == 0
    gone = status(config_path)
    assert gone.returncode == 1 and "no gateway answers" in gone.stderr


def test_a_gateway_that_lost_redis_is_not_serving(
    start_gateway: GatewayFactory, redis_server: RedisServer
) -> None:
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", [])}, config={"redis": {"url": redis_server.url}})
    config_path = gw.root / "sandgate.yaml"
    assert status(config_path, "--wait", "--timeout", "60").returncode == 0
    redis_server.kill()
    proc = status(config_path)
    assert proc.returncode == 1
    # (With redis the gateway's id is its host name and a digest of its state_dir.)
    assert re.fullmatch(rf"sandgate: gateway \S+ \(pid {gw.proc.pid}\) is not ready: redis\n", proc.stderr)


def test_with_the_admin_api_off_the_status_file_answers(start_gateway: GatewayFactory) -> None:
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", [])}, config={"admin": {"enabled": False}})
    config_path = gw.root / "sandgate.yaml"
    proc = status(config_path, "--wait", "--timeout", "60")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (
        f"serving: gateway (pid {gw.proc.pid}), from its status file (the admin API is off)"
    )
    assert gw.stop() == 0
    proc = status(config_path)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"sandgate: no live gateway wrote {gw.root / 'state' / 'gateway.json'} (the admin API is off)\n"
    )


def test_with_workers_status_and_policy_status_name_the_supervisor(start_gateway: GatewayFactory) -> None:
    """The pid named is the one that stops the gateway (the supervisor's), not the lead worker's
    that answers on the admin socket; the workers are listed beside it."""
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", [])}, env={"SANDGATE_WORKERS": "2"})
    config_path = gw.root / "sandgate.yaml"
    first, second = wait_until(lambda: gateway_status(gw), "both workers to serve")["worker_pids"]
    proc = status(config_path, "--wait", "--timeout", "60")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        lines[0]
        == f"serving: gateway {socket.gethostname()} (pid {gw.proc.pid}, the supervisor of 2 workers)"
    )
    assert lines[1] == f"workers: 0 pid {first}, 1 pid {second}"
    assert lines[2] == f"listeners: 127.0.0.1:{gw.port}"
    assert lines[-1] == f"state folder: {gw.root / 'state'}"
    body = json.loads(status(config_path, "--format", "json").stdout)
    assert body["status"]["pid"] == gw.proc.pid
    assert [(w["index"], w["pid"]) for w in body["status"]["workers"]] == [(0, first), (1, second)]
    # `policy status` names the same pid (it used to name the lead worker's).
    policy = subprocess.run(
        [SANDGATE, "policy", "status", "--config", str(config_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert policy.stdout.splitlines()[0] == (
        f"gateway {socket.gethostname()} (pid {gw.proc.pid}, the supervisor of 2 workers), ready"
    ), policy.stdout


@pytest.mark.parametrize("admin", [True, False], ids=["admin API on", "admin API off"])
def test_a_gateway_that_holds_its_state_folder_but_does_not_serve_yet_is_starting(
    tmp_path: Path, admin: bool
) -> None:
    config: dict[str, Any] = {} if admin else {"admin": {"enabled": False}}
    config_path, _ = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [])}, config=config)
    state = tmp_path / "state"
    lock = state / "gateway.lock"
    gw = subprocess.Popen(
        [SANDGATE, "run", "--config", str(config_path)],
        stderr=subprocess.DEVNULL,
        env={**os.environ, "SANDGATE_WORKERS": "1"},
    )
    try:
        # It locks its state folder first thing, a second before mitmproxy is even loaded:
        # frozen from then on, it is a gateway that is starting for as long as this test needs.
        wait_until(lambda: lock.exists() and lock.read_text().strip() == str(gw.pid), "the lock")
        os.kill(gw.pid, signal.SIGSTOP)
        proc = status(config_path)
        waited = status(config_path, "--wait", "--timeout", "1")
    finally:
        os.kill(gw.pid, signal.SIGCONT)
        gw.terminate()  # (before its handlers are set, SIGTERM's default action ends it)
        gw.wait(30)
    why = (
        f"nothing answers on {state / 'admin.sock'} yet"
        if admin
        else f"{state / 'gateway.json'} is not written yet"
    )
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == f"sandgate: gateway (pid {gw.pid}) is starting: {why}\n"
    assert waited.returncode == 1
    assert waited.stderr == (
        f"sandgate: waiting up to 1 s for the gateway on state folder {state} "
        f"(the state_dir of --config {config_path})\n"
        f"sandgate: not serving after 1 s on state folder {state}: gateway (pid {gw.pid}) is starting: {why}\n"
    )
    # It exited (the kernel let the lock go): no gateway, as before.
    gone = status(config_path)
    assert gone.returncode == 1 and "is starting" not in gone.stderr
