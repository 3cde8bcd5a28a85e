"""A gateway with two workers: real `sandgate run --workers 2` processes, real connections, signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import SANDGATE, GatewayFactory, RunningGateway, curl, tenant_yaml, write_gateway_files
from support import RecordingUpstream, free_port_run
from support.processes import alive, gateway_status, wait_until

from sandgate.proxy.state.unix_sockets import internal_socket_folder

pytestmark = pytest.mark.slow

TWO = {"SANDGATE_WORKERS": "2"}


def worker_status(gw: RunningGateway, index: int) -> dict[str, Any] | None:
    try:
        status: dict[str, Any] = json.loads(
            (gw.root / "state" / "workers" / f"w{index}" / "gateway.json").read_text()
        )
    except (OSError, ValueError):
        return None
    return status


def status_of(gw: RunningGateway, url: str) -> str:
    """The status code of one request through the gateway (a new connection each time)."""
    done = curl("-o", "/dev/null", "-w", "%{http_code}", "-x", gw.proxy(), url)
    return done.stdout if done.stdout != "000" else f"000: {done.stderr.strip()}"


def accepted_by(pid: int, port: int) -> int:
    """Established connections to local `port` whose socket the process `pid` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        if local_port == port and fields[3] == "01" and fields[9] in inodes:
            count += 1
    return count


@pytest.fixture
def two_workers(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> tuple[RunningGateway, str]:
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)}, config={"reload": {"watch": False}}, env=TWO)
    wait_until(lambda: gateway_status(gw), "both workers to serve")
    return gw, f"{http_upstream.url_for('api.test')}/x"


def test_both_workers_accept_on_the_one_explicit_port(two_workers: tuple[RunningGateway, str]) -> None:
    gw, url = two_workers
    status = gateway_status(gw)
    assert status is not None and status["pid"] == gw.proc.pid
    pids = status["worker_pids"]
    assert len(set(pids)) == 2 and gw.proc.pid not in pids
    # Forty connections held open: the kernel spreads them over both listening workers.
    conns = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(40)]
    try:

        def counts() -> list[int] | None:
            found = [accepted_by(pid, gw.port) for pid in pids]
            return found if sum(found) == 40 else None

        spread = wait_until(counts, "every connection accepted")
        assert all(n > 0 for n in spread), spread
    finally:
        for conn in conns:
            conn.close()
    assert status_of(gw, url) == "200"


def test_sighup_reloads_every_worker(two_workers: tuple[RunningGateway, str]) -> None:
    gw, _ = two_workers

    def version(status: dict[str, Any] | None) -> str | None:
        return None if status is None else str(status["policy_version"])

    before = {version(worker_status(gw, 0)), version(worker_status(gw, 1))}
    assert len(before) == 1 and None not in before
    gw.write_tenant("t2.yaml", tenant_yaml("t2", [], sandbox="sb2"))
    gw.reload()

    def reloaded() -> bool:
        versions = [version(worker_status(gw, 0)), version(worker_status(gw, 1)), version(gateway_status(gw))]
        # Every worker, and the gateway's status (the lead's), on the new version.
        return len(set(versions)) == 1 and versions[0] not in before

    wait_until(reloaded, "every worker to reload")


@pytest.mark.parametrize(
    ("trigger", "admin"),
    [("file_change", True), ("sighup", True), ("file_change", False)],
    ids=["a change on disk", "SIGHUP", "a change on disk, admin API off"],
)
def test_a_reload_record_means_every_worker_has_the_policy(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, trigger: str, admin: bool
) -> None:
    # Each worker sees the change itself; the one record is written once the peers confirmed
    # it, so no request after the record is decided on the old policy, whichever worker takes it.
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    config: dict[str, Any] = {"reload": {"watch": trigger == "file_change"}}
    if not admin:
        config["admin"] = {"enabled": False}
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)}, config=config, env=TWO)
    wait_until(lambda: gateway_status(gw), "both workers to serve")
    url = f"{http_upstream.url_for('api.test')}/x"
    assert status_of(gw, url) == "200"
    gw.mark()
    gw.write_tenant("t1.yaml", tenant_yaml("t1", []))
    if trigger == "sighup":
        gw.reload()
    (record,) = gw.records(1, event="policy_reload", timeout=20)
    assert (record["trigger"], record["result"], record["worker"]) == (trigger, "ok", 0)
    assert [(w["index"], w["ok"], w["policy_version"]) for w in record["workers"]] == [
        (0, True, record["policy_version"]),
        (1, True, record["policy_version"]),
    ]
    # New connections, spread over both workers by the kernel: every one is refused now.
    assert {status_of(gw, url) for _ in range(20)} == {"403"}
    # Each peer loaded the change once: what the lead asked after it, it had already, or not yet.
    assert gw.log().count('"policy.reloaded"') == 2
    assert len(gw.records(event="policy_reload")) == 1


def test_sigterm_drains_both_workers_and_exits_0(two_workers: tuple[RunningGateway, str]) -> None:
    gw, _ = two_workers
    status = gateway_status(gw)
    assert status is not None
    assert gw.stop() == 0
    for pid in status["worker_pids"]:
        assert not alive(pid), f"worker {pid} outlived the supervisor"
    assert not (gw.root / "state" / "gateway.json").exists()
    assert gw.log().count('"gateway.ready"') == 2
    # The collector and the limit relay went with the supervisor.
    assert not (gw.root / "state" / "workers" / "audit.sock").exists()
    assert not (gw.root / "state" / "workers" / "limits.sock").exists()


def test_a_killed_worker_is_replaced_and_the_gateway_keeps_serving(
    two_workers: tuple[RunningGateway, str],
) -> None:
    gw, url = two_workers
    status = gateway_status(gw)
    assert status is not None
    first, second = status["worker_pids"]
    # Twenty connections, spread over both workers, each recorded in the one audit file.
    for _ in range(20):
        assert status_of(gw, url) == "200"
    # One trail; each record says which worker decided (the kernel spread the connections).
    first_twenty = gw.records(20)
    assert len(first_twenty) == 20
    assert sorted({r["worker"] for r in first_twenty}) == [0, 1]
    os.kill(second, signal.SIGKILL)
    # Gone (its listening socket closed with it: what was queued there is lost, as with any
    # crash); the gateway keeps answering.
    wait_until(lambda: not alive(second), "the worker to die")
    wait_until(lambda: status_of(gw, url) == "200", "an answer while worker 1 restarts")

    def replacement() -> list[int] | None:
        status, own = gateway_status(gw), worker_status(gw, 1)
        if status is None or own is None or status["worker_pids"][1] == second:
            return None
        return list(status["worker_pids"]) if own["pid"] == status["worker_pids"][1] else None

    replaced = wait_until(replacement, "worker 1 replaced")
    assert replaced[0] == first and alive(replaced[1])
    for _ in range(10):
        assert status_of(gw, url) == "200"
    assert '"worker.exited"' in gw.log()
    assert gw.stop() == 0
    # The supervisor's collector kept every record the other workers sent: none lost, none twice.
    records = gw.records()
    assert len(records) >= 31
    assert len({r["decision_id"] for r in records}) == len(records)


def test_a_killed_supervisor_takes_its_workers_down(two_workers: tuple[RunningGateway, str]) -> None:
    gw, _ = two_workers
    status = gateway_status(gw)
    assert status is not None
    gw.proc.kill()
    gw.proc.wait(5)
    pids: list[int] = status["worker_pids"]
    wait_until(lambda: not any(alive(pid) for pid in pids), "the workers to exit", timeout=20)
    # The limit relay (a redis-server the supervisor started) goes with it too.
    broker = str(gw.root / "state" / "workers" / "limits.sock")
    wait_until(lambda: not brokers_serving(broker), "the limit relay to exit", timeout=10)


def brokers_serving(socket_path: str) -> list[int]:
    """Live redis-server processes started on this unix socket."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "redis-server" in cmdline and socket_path in cmdline and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def test_a_sighup_while_workers_start_reaches_them_once_they_serve(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream
) -> None:
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)}, config={"reload": {"watch": False}}, env=TWO)
    # At once: the workers are still importing (no handler yet: SIGHUP would kill them).
    gw.reload()
    status = wait_until(lambda: gateway_status(gw), "both workers to serve")
    # Every worker took the reload instead of dying from it: none was restarted.
    assert "worker.exited" not in gw.log()
    # ... and each reloaded once it served.
    wait_until(lambda: sighup_reloads(gw) >= 2 or None, "both workers' SIGHUP reloads", timeout=20)
    assert "worker.exited" not in gw.log()
    assert all(alive(pid) for pid in status["worker_pids"])


def sighup_reloads(gw: RunningGateway) -> int:
    return sum(1 for line in gw.log().splitlines() if "policy.reloaded" in line and "sighup" in line)


@pytest.mark.parametrize("reuse_port", [False, True], ids=["a plain listener", "a SO_REUSEPORT listener"])
def test_a_taken_explicit_port_stops_the_start_with_one_line(tmp_path: Path, reuse_port: bool) -> None:
    config_path, port = write_gateway_files(tmp_path / "gw", {"t1.yaml": tenant_yaml("t1", [])})
    with socket.socket() as holder:
        if reuse_port:
            # Another gateway's worker, say: the workers' own option does not get a third process in.
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        proc = subprocess.run(
            [SANDGATE, "run", "--config", str(config_path), "--workers", "2"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1
    assert (
        proc.stderr
        == f"sandgate: proxy listener 127.0.0.1:{port}: port {port} is in use: pass a free one with --port\n"
    )
    assert not (tmp_path / "gw" / "state" / "workers").exists(), "no worker was started"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"listeners": [{"mode": "transparent", "host": "127.0.0.1", "port": 0}]},
            "the transparent listener's port is 0 (any free port): with 2 workers it must be fixed",
        ),
        (
            {"listeners": [{"host": "127.0.0.1", "port": 0}], "dns": {"host": "127.0.0.1", "port": 0}},
            "dns.port is 0 (any free port): with 2 workers it must be fixed",
        ),
        (
            {
                "listeners": [{"mode": "transparent", "host": "127.0.0.1", "port": 0}],
                "dns": {"host": "127.0.0.1", "port": 0},
            },
            "dns.port is 0",
        ),
    ],
    ids=["a transparent listener on any port", "a DNS listener on any port", "both on any port"],
)
def test_workers_refuse_listeners_the_host_rules_cannot_name(
    tmp_path: Path, config: dict[str, Any], expected: str
) -> None:
    config_path, _ = write_gateway_files(tmp_path / "gw", {"t1.yaml": tenant_yaml("t1", [])}, config=config)
    proc = subprocess.run(
        [SANDGATE, "run", "--config", str(config_path), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr
    assert not (tmp_path / "gw" / "state" / "workers").exists(), "no worker was started"


def test_a_worker_port_range_running_into_another_listener_stops_the_start(tmp_path: Path) -> None:
    base = free_port_run(3, "127.0.0.1")
    config = {
        "listeners": [
            {"host": "127.0.0.1", "port": base + 2},
            {"mode": "transparent", "host": "127.0.0.1", "port": base},
        ],
        "dns": {"host": "127.0.0.1", "port": base + 1},
    }
    config_path, _ = write_gateway_files(tmp_path / "gw", {"t1.yaml": tenant_yaml("t1", [])}, config=config)
    proc = subprocess.run(
        [SANDGATE, "run", "--config", str(config_path), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    # Worker 1's transparent port is base + 1: the DNS listener's (tcp) port.
    assert f"(worker 1) would share tcp port {base + 1} with the DNS listener" in proc.stderr
    assert not (tmp_path / "gw" / "state" / "workers").exists(), "no worker was started"


def test_a_deep_state_dir_still_serves_with_two_workers(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    # <state>/workers/w1.sock would not fit in a socket address: the internal sockets move to
    # a private folder under /tmp, and the gateway serves as usual.
    # Deep enough that "<state>/workers/w1.sock" does not fit in 107 bytes, shallow enough
    # that the public "<state>/admin.sock" still does.
    pad = 92 - len(str(tmp_path)) - len("//state")
    state = tmp_path / ("d" * pad) / "state"
    assert len(str(state / "admin.sock")) <= 107 < len(str(state / "workers" / "w1.sock")) + 4
    rules = [{"hosts": ["api.test"], "ports": [http_upstream.port]}]
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)}, config={"state_dir": str(state)}, env=TWO)
    status = wait_until(lambda: read_json(state / "gateway.json"), "both workers to serve")
    assert status["workers"] == 2
    assert status_of(gw, f"{http_upstream.url_for('api.test')}/x") == "200"
    assert not (state / "workers" / "w1.sock").exists()
    folder = internal_socket_folder(state)
    assert (folder / "w1.sock").is_socket() and (folder / "audit.sock").is_socket()
    assert gw.stop() == 0
    assert not folder.exists(), "the /tmp folder of the internal sockets goes with the gateway"


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        value: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value
