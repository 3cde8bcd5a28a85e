"""Transparent sandboxes declared in tenant files: host rules at start and at reload, conflicts
with run-time registrations refused naming both places, and a broken file keeps the last good
rules (fail closed).

Real parts: a gateway with explicit, transparent and DNS listeners, guests in network
namespaces on veth pairs, sandgate's nftables table, file-watch reloads, the real CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SANDGATE, TOKEN_REF, records_when, wait_quiet, write_gateway_files
from support import RecordingUpstream, free_port_run, wait_for_port
from support.netns import Namespace, NetnsLab, in_namespace, netns_lab

pytestmark = [pytest.mark.root, pytest.mark.slow]

RULE = [{"id": "api", "hosts": ["api.test"], "ports": [80]}]


def tenant(name: str, sandboxes: list[dict[str, Any]]) -> str:
    token = {"id": f"{name}-tok", "token": TOKEN_REF}
    return yaml.safe_dump({"tenant": name, "sandboxes": [token, *sandboxes], "allow": RULE}, sort_keys=False)


@dataclass
class Lab:
    nl: NetnsLab
    up: Namespace
    g1: Namespace
    g2: Namespace
    root: Path
    config: Path
    table: str
    gateway: subprocess.Popen[bytes] | None = None

    @property
    def tenants(self) -> Path:
        return self.root / "rules" / "tenants"

    def start(self) -> None:
        log = (self.root / "gateway.log").open("ab")
        self.gateway = subprocess.Popen(
            [SANDGATE, "run", "--config", str(self.config)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        cfg = yaml.safe_load(self.config.read_text())
        wait_for_port("127.0.0.1", cfg["listeners"][1]["port"], timeout=60)
        _until(lambda: (self.root / "state" / "gateway.json").exists(), "the gateway is ready")

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.terminate()
            self.gateway.wait(20)
            self.gateway = None

    def ruleset(self) -> str:
        r = subprocess.run(["nft", "list", "table", "inet", self.table], capture_output=True, text=True)
        return r.stdout

    def sandgate(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SANDGATE, *args, "--config", str(self.config)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "TOK": "a-token-for-the-test-0123456789"},
        )

    def curl(self, guest: Namespace, path: str) -> str:
        r = guest.exec(
            "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "5", f"http://api.test{path}"
        )
        return r.stdout

    def records(self, path: str, *, expect: bool = True) -> list[dict[str, Any]]:
        """The decision records of requests for `path`: once there is one (the audit writer
        flushes asynchronously), or with `expect=False` once the audit file has been still."""
        audit = self.root / "state" / "audit" / "audit.jsonl"

        def read() -> list[dict[str, Any]]:
            lines = audit.read_text().splitlines() if audit.exists() else []
            return [
                r for r in map(json.loads, lines) if r.get("event") == "decision" and r.get("path") == path
            ]

        if not expect:
            wait_quiet(audit, 0.4)
            return read()
        return records_when(read, bool)

    def status(self) -> dict[str, Any]:
        return dict(json.loads((self.root / "state" / "gateway.json").read_text()))


def _until(predicate: Callable[[], object], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with netns_lab() as nl:
        up, g1, g2 = nl.add("up"), nl.add("g1"), nl.add("g2")
        web = in_namespace(up.name, lambda: RecordingUpstream(up.addr, 80, name="web").start())
        table = f"sgs_{nl.tag}"
        explicit = free_port_run(3)
        config, _ = write_gateway_files(
            tmp_path,
            {
                "t1.yaml": tenant("t1", [{"id": "vm1", "interface": g1.host_if, "addresses": [g1.addr]}]),
                "t2.yaml": tenant("t2", []),
            },
            # Ports below the kernel's ephemeral range: the gateway restarts on them, and a port
            # from that range can be taken meanwhile by any process's outgoing connection.
            config={
                "listeners": [
                    {"host": "127.0.0.1", "port": explicit},
                    {"mode": "transparent", "host": "0.0.0.0", "port": explicit + 1},
                ],
                "dns": {"host": "0.0.0.0", "port": explicit + 2},
                "resolver": {"hosts": {"api.test": [up.addr]}},
                "address_guard": {"reachable_by_name": [f"10.200.{nl.subnet}.0/24"]},
                "host_rules": {"table": table},
            },
        )
        for g in (g1, g2):
            g.resolv_conf(g.host_addr)
        lab = Lab(nl, up, g1, g2, tmp_path, config, table)
        try:
            yield lab
        finally:
            lab.stop()
            web.stop()
            subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True)


def test_a_tenant_file_sandbox_is_gated_from_start_and_follows_its_file(lab: Lab) -> None:
    lab.start()
    assert lab.g1.host_if in lab.ruleset() and lab.g1.addr in lab.ruleset()
    assert lab.curl(lab.g1, "/static-1") == "200"
    assert [(r["sandbox"], r["tenant"]) for r in lab.records("/static-1")] == [("vm1", "t1")]

    # A reload moves it to t2 on another interface: the old interface's rules go, the new ones come.
    (lab.tenants / "t1.yaml").write_text(tenant("t1", []))
    (lab.tenants / "t2.yaml").write_text(
        tenant("t2", [{"id": "vm1", "interface": lab.g2.host_if, "addresses": [lab.g2.addr]}])
    )
    _until(lambda: lab.g2.host_if in lab.ruleset() and lab.g1.host_if not in lab.ruleset(), "rules moved")
    _until(lambda: lab.curl(lab.g2, "/static-2") == "200", "g2 is served")
    assert {(r["sandbox"], r["tenant"]) for r in lab.records("/static-2")} == {("vm1", "t2")}
    # g1 is no sandbox any more: its traffic is not redirected to the gateway.
    assert lab.curl(lab.g1, "/static-3") != "200" or not lab.records("/static-3", expect=False)
    assert not lab.records("/static-3", expect=False)

    # Removed from its file: no rules are left (nothing else is registered).
    (lab.tenants / "t2.yaml").write_text(tenant("t2", []))
    _until(lambda: lab.g2.host_if not in lab.ruleset(), "rules removed")


def test_run_time_registrations_cannot_take_a_tenant_file_sandbox(lab: Lab) -> None:
    lab.start()
    same_id = lab.sandgate("sandbox", "add", "--id", "vm1", "--tenant", "t2", "--token", "env:TOK")
    assert same_id.returncode == 2
    assert "sandbox 'vm1' is already registered" in same_id.stderr
    assert "t1.yaml" in same_id.stderr and "sandboxes.json" in same_id.stderr
    same_if = lab.sandgate(
        "sandbox", "add", "--id", "other", "--tenant", "t2", "--interface", lab.g1.host_if,
        "--address", lab.g1.addr[:-1] + "3",
    )  # fmt: skip
    assert same_if.returncode == 2
    assert f"interface {lab.g1.host_if} carries sandbox 'vm1' (in tenant file" in same_if.stderr
    same_addr = lab.sandgate(
        "sandbox", "add", "--id", "other", "--tenant", "t2", "--interface", lab.g2.host_if,
        "--address", lab.g1.addr,
    )  # fmt: skip
    assert same_addr.returncode == 2
    assert f"address {lab.g1.addr} belongs to 'vm1' (in tenant file" in same_addr.stderr

    # A run-time sandbox beside it: adding and removing it leaves the tenant file's rules alone.
    add = lab.sandgate(
        "sandbox", "add", "--id", "dyn", "--tenant", "t2", "--interface", lab.g2.host_if,
        "--address", lab.g2.addr,
    )  # fmt: skip
    assert add.returncode == 0, add.stderr
    assert lab.g1.host_if in lab.ruleset() and lab.g2.host_if in lab.ruleset()
    assert lab.curl(lab.g2, "/dyn") == "200"
    assert lab.sandgate("sandbox", "remove", "dyn").returncode == 0
    assert lab.g1.host_if in lab.ruleset() and lab.g2.host_if not in lab.ruleset()
    assert lab.curl(lab.g1, "/after-remove") == "200"


def test_a_broken_tenant_file_keeps_its_sandboxes_rules(lab: Lab) -> None:
    lab.start()
    version = lab.status()["policy_version"]
    (lab.tenants / "t1.yaml").write_text("tenant: t1\nsandboxes: [{id: vm1, interface: 7}\n")
    _until(lambda: lab.status().get("policy_problems"), "the reload reports the broken file")
    assert lab.status()["policy_version"] == version or lab.status()["policy_problems"][0]["kept_last_good"]
    assert lab.g1.host_if in lab.ruleset()
    assert lab.curl(lab.g1, "/kept") == "200"  # the last good version still serves it
    assert [r["tenant"] for r in lab.records("/kept")] == ["t1"]

    # Restarted with the file still broken: no last good version, but the rules stay (fail
    # closed): the guest is gated and unidentified, never forwarded past the gateway.
    lab.stop()
    lab.start()
    assert lab.g1.host_if in lab.ruleset() and lab.g1.addr in lab.ruleset()
    assert lab.curl(lab.g1, "/unidentified") != "200"
    assert [r["reason"] for r in lab.records("/unidentified", expect=False)] in ([], ["no_identity"])

    # Fixed: served again.
    (lab.tenants / "t1.yaml").write_text(
        tenant("t1", [{"id": "vm1", "interface": lab.g1.host_if, "addresses": [lab.g1.addr]}])
    )
    _until(lambda: lab.curl(lab.g1, "/fixed") == "200", "the fixed file serves g1 again")


def test_an_interface_that_does_not_exist_yet_gets_its_rules_at_start(lab: Lab) -> None:
    later = f"sgl-{lab.nl.tag}"
    (lab.tenants / "t2.yaml").write_text(
        tenant("t2", [{"id": "vm-later", "interface": later, "addresses": ["10.200.250.2", "fd00:200::2"]}])
    )
    lab.start()
    ruleset = lab.ruleset()
    assert f'"{later}"' in ruleset and "10.200.250.2" in ruleset and "fd00:200::2" in ruleset
    assert lab.curl(lab.g1, "/still") == "200"


def test_a_tenant_file_that_takes_a_registered_interface_wins_and_says_so(lab: Lab) -> None:
    lab.start()
    add = lab.sandgate(
        "sandbox", "add", "--id", "dyn", "--tenant", "t1", "--interface", lab.g2.host_if,
        "--address", lab.g2.addr,
    )  # fmt: skip
    assert add.returncode == 0, add.stderr
    assert lab.curl(lab.g2, "/as-dyn") == "200"
    assert [(r["sandbox"], r["tenant"]) for r in lab.records("/as-dyn")] == [("dyn", "t1")]

    # t2's file now declares g2 itself: the file wins, the registry entry is left out.
    (lab.tenants / "t2.yaml").write_text(
        tenant("t2", [{"id": "vm2", "interface": lab.g2.host_if, "addresses": [lab.g2.addr]}])
    )
    _until(lambda: "vm2" in (lab.root / "state" / "static-sandboxes.json").read_text(), "vm2 installed")
    _until(lambda: lab.curl(lab.g2, "/as-static") == "200", "g2 is served")
    assert {(r["sandbox"], r["tenant"]) for r in lab.records("/as-static")} == {("vm2", "t2")}
    # One interface, one set of rules (the registry's copy is not installed beside it).
    assert lab.ruleset().count(f'"{lab.g2.host_if}" . {lab.g2.addr}') == 1
    log = (lab.root / "gateway.log").read_text()
    refused = [line for line in log.splitlines() if "registry.entries_refused" in line]
    assert refused and "t2.yaml" in refused[-1] and "sandboxes.json" in refused[-1], refused


def test_a_registered_sandbox_whose_address_a_tenant_file_takes_is_shut_not_opened(lab: Lab) -> None:
    lab.start()
    add = lab.sandgate(
        "sandbox", "add", "--id", "dyn", "--tenant", "t1", "--interface", lab.g2.host_if,
        "--address", lab.g2.addr,
    )  # fmt: skip
    assert add.returncode == 0, add.stderr
    assert lab.curl(lab.g2, "/before") == "200"

    # t2's file claims g2's address on another (not yet existing) interface: the registry entry
    # loses its address, and its interface must stay guarded (dropped), never left unguarded.
    (lab.tenants / "t2.yaml").write_text(
        tenant("t2", [{"id": "vm2", "interface": "sgx-later", "addresses": [lab.g2.addr]}])
    )
    _until(lambda: "vm2" in (lab.root / "state" / "static-sandboxes.json").read_text(), "vm2 installed")
    ifaces = lab.ruleset().split("set ifaces {", 1)[1].split("}", 1)[0]  # the guarded interfaces
    assert f'"{lab.g2.host_if}"' in ifaces, ifaces
    assert lab.curl(lab.g2, "/after") != "200"
    assert lab.records("/after", expect=False) == []
