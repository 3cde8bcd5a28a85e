"""A gateway with two workers fronting two sandbox interfaces: the host rules it installs steer
each interface to one worker (worker i listens on T+i and D+i), its TCP and its DNS alike, and
each guest is served through its names from there.

Everything runs inside namespaces this module creates, the nft table included:
  gw    plays the host: the gateway (`sandgate run --workers 2`) runs here
  up    the upstream: HTTP :80 and DNS :53
  g1    guest of sandbox sb1, on an interface the hash gives to one worker
  g2    guest of sandbox sb2, on an interface the hash gives to the other
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import SANDGATE, tenant_yaml, write_gateway_files
from support import RecordingUpstream, ScriptedDNSServer
from support.netns import in_namespace, ip

from sandgate.proxy.state.table_name import default_table
from sandgate.proxy.worker_role import worker_for

pytestmark = [pytest.mark.root, pytest.mark.slow]

T, D, WORKERS = 18081, 18053, 2
# Holds one TCP connection from inside a guest for a few seconds (argv: address, port).
HOLD = "import socket,sys,time\ns=socket.create_connection((sys.argv[1],int(sys.argv[2])),5)\ntime.sleep(6)\n"


@dataclass
class Guest:
    ns: str
    host_if: str
    host4: str
    addr4: str


@dataclass
class Lab:
    tag: str
    gw: str
    state: Path
    config: Path
    guests: dict[str, Guest] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    def guest(self, role: str, n: int, host_if: str) -> Guest:
        ns, ns_if = f"sghw-{role}-{self.tag}", f"hw{n}n-{self.tag}"
        s = int(self.tag[:2], 16)
        g = Guest(ns, host_if, f"10.205.{s}.{4 * n + 1}", f"10.205.{s}.{4 * n + 2}")
        ip("netns", "add", ns)
        self.namespaces.append(ns)
        ip("-n", self.gw, "link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", ns)
        ip("-n", self.gw, "addr", "add", f"{g.host4}/30", "dev", host_if)
        ip("-n", self.gw, "link", "set", host_if, "up")
        ip("-n", ns, "addr", "add", f"{g.addr4}/30", "dev", ns_if)
        ip("-n", ns, "link", "set", ns_if, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        if role != "up":
            ip("-n", ns, "route", "add", "default", "via", g.host4)
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "resolv.conf").write_text(f"nameserver {g.host4}\noptions timeout:2 attempts:2\n")
        self.guests[role] = g
        return g

    def log(self) -> str:
        path = self.state.parent / "gateway.log"
        return path.read_text()[-3000:] if path.exists() else ""


def netns_exec(ns: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=timeout, env=os.environ
    )


def _interface_for(tag: str, worker: int) -> str:
    """A host-side interface name the hash gives to `worker` of WORKERS."""
    return next(f"hw{k}h-{tag}" for k in range(100) if worker_for(f"hw{k}h-{tag}", WORKERS) == worker)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tag = secrets.token_hex(2)
    root = tmp_path_factory.mktemp("hostnet-workers")
    s = int(tag[:2], 16)
    t1 = tenant_yaml("t1", [{"id": "api", "hosts": ["api.test"], "ports": [80]}], sandbox="static-t1")
    config, _ = write_gateway_files(
        root,
        {"t1.yaml": t1},
        config={
            "listeners": [{"mode": "transparent", "host": "0.0.0.0", "port": T}],
            "dns": {"host": "0.0.0.0", "port": D},
            "resolver": {"hosts": {}, "nameservers": [f"10.205.{s}.2:53"]},
            "address_guard": {"reachable_by_name": [f"10.205.{s}.0/24"]},
        },
    )
    lab = Lab(tag, f"sghw-gw-{tag}", root / "state", config)
    servers: list[Any] = []
    try:
        ip("netns", "add", lab.gw)
        lab.namespaces.append(lab.gw)
        ip("-n", lab.gw, "link", "set", "lo", "up")
        up = lab.guest("up", 0, f"hw99u-{tag}")
        lab.guest("g1", 1, _interface_for(tag, 0))
        lab.guest("g2", 2, _interface_for(tag, 1))
        servers.append(in_namespace(up.ns, lambda: RecordingUpstream(up.addr4, 80, name="web").start()))
        records = {"api.test": [up.addr4]}
        servers.append(
            in_namespace(up.ns, lambda: ScriptedDNSServer(up.addr4, 53, records=records, ttl=60).start())
        )
        with (root / "gateway.log").open("ab") as log:
            lab.proc = subprocess.Popen(
                ["ip", "netns", "exec", lab.gw, SANDGATE, "run", "--config", str(config), "--workers", "2"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 90  # two gateway processes on a loaded machine
        status = lab.state / "gateway.json"
        while not (status.exists() and json.loads(status.read_text()).get("workers") == WORKERS):
            assert lab.proc.poll() is None, f"gateway exited {lab.proc.returncode}: {lab.log()}"
            assert time.monotonic() < deadline, f"gateway did not start: {lab.log()}"
            time.sleep(0.2)
        for role in ("g1", "g2"):
            g = lab.guests[role]
            added = netns_exec(
                lab.gw, SANDGATE, "sandbox", "add", "--config", str(config), "--interface", g.host_if,
                "--address", g.addr4, "--tenant", "t1", "--id", f"sb-{role}",
            )  # fmt: skip
            assert added.returncode == 0, added.stderr + lab.log()
        yield lab
    finally:
        if lab.proc is not None and lab.proc.poll() is None:
            lab.proc.terminate()
            try:
                lab.proc.wait(30)
            except subprocess.TimeoutExpired:
                lab.proc.kill()
                lab.proc.wait(5)
        for server in servers:
            server.stop()
        for ns in lab.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            etc = Path("/etc/netns") / ns
            if etc.exists():
                for f in etc.iterdir():
                    f.unlink()
                etc.rmdir()


def _map(lab: Lab, name: str) -> dict[str, int]:
    listed = netns_exec(lab.gw, "nft", "-j", "list", "map", "inet", default_table(lab.state), name)
    assert listed.returncode == 0, listed.stderr
    elems = next(i["map"] for i in json.loads(listed.stdout)["nftables"] if "map" in i).get("elem", [])
    return {key: port for key, port in elems}


def _landed_on(lab: Lab, guest: Guest, port: int) -> int:
    """The local port a held TCP connection from `guest` to `port` (anywhere) was accepted on."""
    hold = subprocess.Popen(
        ["ip", "netns", "exec", guest.ns, sys.executable, "-c", HOLD, "192.0.2.10", str(port)]
    )
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            ss = netns_exec(lab.gw, "ss", "-Htn", "state", "established", "dst", guest.addr4)
            local = [line.split()[-2] for line in ss.stdout.splitlines() if line.strip()]
            if local:
                return int(local[0].rsplit(":", 1)[1])
            time.sleep(0.1)
        raise AssertionError(f"no connection from {guest.addr4}")
    finally:
        hold.kill()
        hold.wait()


def test_the_gateway_steers_each_interface_to_one_workers_ports(lab: Lab) -> None:
    g1, g2 = lab.guests["g1"], lab.guests["g2"]
    assert _map(lab, "tcp_port") == {g1.host_if: T, g2.host_if: T + 1}
    assert _map(lab, "dns_port") == {g1.host_if: D, g2.host_if: D + 1}


def test_each_guests_tcp_and_dns_land_on_its_own_worker(lab: Lab) -> None:
    for guest, worker in ((lab.guests["g1"], 0), (lab.guests["g2"], 1)):
        assert _landed_on(lab, guest, 80) == T + worker  # a port the tenant allows: held open
        assert _landed_on(lab, guest, 53) == D + worker


def test_each_guest_is_served_through_its_names(lab: Lab) -> None:
    for role in ("g1", "g2"):
        got = netns_exec(lab.guests[role].ns, "curl", "-4", "-sS", "-m", "10", f"http://api.test/{role}")
        assert got.returncode == 0, got.stderr + lab.log()
        assert json.loads(got.stdout)["path"] == f"/{role}"


def test_a_jail_through_the_running_gateway_is_steered_and_served(lab: Lab) -> None:
    """`jail` registers with the running two-worker gateway: its interface is steered like any
    other, and the command runs once the worker it lands on knows it."""
    got = netns_exec(
        lab.gw, SANDGATE, "jail", "--config", str(lab.config), "--tenant", "t1", "--",
        "curl", "-sS", "-m", "10", "http://api.test/jailed",
    )  # fmt: skip
    assert got.returncode == 0, got.stderr + lab.log()
    assert json.loads(got.stdout)["path"] == "/jailed"
    # Cleaned up: only the two registered guests are left in the maps.
    assert set(_map(lab, "tcp_port")) == {lab.guests["g1"].host_if, lab.guests["g2"].host_if}
