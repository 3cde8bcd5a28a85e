"""Host rules for real sandbox networks: several addresses per sandbox, IPv4 and IPv6 guests,
anti-spoofing for both families, and one nftables table per gateway state directory.

Everything runs inside namespaces this module creates, the nft tables included:
  gw    plays the host: two gateways (state directories A and B) run here
  up    the upstream: HTTP :80 on an IPv4 and an IPv6 address, DNS :53 (A and AAAA)
  g1    guest of sandbox sb1 (gateway A): one IPv4 and one IPv6 address
  g2    guest of sandbox sb2 (gateway A): tries to send from sb1's addresses
  g3    the interface of sandbox sb3 (gateway B), registered before B starts
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import SANDGATE, tenant_yaml, write_gateway_files
from support import RecordingUpstream, ScriptedDNSServer, free_port
from support.netns import in_namespace, ip

from sandgate.proxy.state.table_name import default_table

pytestmark = [pytest.mark.root, pytest.mark.slow]

PYTHON = str(Path(SANDGATE).with_name("python"))
# A one-shot UDP DNS query from inside a namespace: prints the answer's addresses.
DIG = (
    "import sys,dns.message,dns.query\n"
    "q=dns.message.make_query(sys.argv[2],sys.argv[3])\n"
    "r=dns.query.udp(q,sys.argv[1],timeout=5)\n"
    "print(' '.join(i.address for a in r.answer for i in a))\n"
)


@dataclass
class Guest:
    ns: str
    host_if: str
    host4: str
    addr4: str
    host6: str
    addr6: str


@dataclass
class Net:
    tag: str
    gw: str
    up: Guest
    guests: dict[str, Guest]
    namespaces: list[str]
    links: list[str]

    @property
    def group6(self) -> str:
        """The tag as an IPv6 group in canonical form (no leading zero, as the kernel prints it)."""
        return f"{int(self.tag, 16):x}"

    def guest(self, role: str, n: int, *, route: bool = True) -> Guest:
        """A namespace joined to gw by a veth pair, with an IPv4 /30 and an IPv6 /64."""
        ns, host_if, ns_if = f"sghn-{role}-{self.tag}", f"hn{n}h-{self.tag}", f"hn{n}n-{self.tag}"
        s = int(self.tag[:2], 16)
        g = Guest(ns, host_if, f"10.203.{s}.{4 * n + 1}", f"10.203.{s}.{4 * n + 2}",
                  f"fd5a:{self.group6}:{n}::1", f"fd5a:{self.group6}:{n}::2")  # fmt: skip
        ip("netns", "add", ns)
        self.namespaces.append(ns)
        ip("-n", self.gw, "link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", ns)
        self.links.append(host_if)
        ip("-n", self.gw, "addr", "add", f"{g.host4}/30", "dev", host_if)
        ip("-n", self.gw, "addr", "add", f"{g.host6}/64", "dev", host_if, "nodad")
        ip("-n", self.gw, "link", "set", host_if, "up")
        ip("-n", ns, "addr", "add", f"{g.addr4}/30", "dev", ns_if)
        ip("-n", ns, "addr", "add", f"{g.addr6}/64", "dev", ns_if, "nodad")
        ip("-n", ns, "link", "set", ns_if, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        if route:
            ip("-n", ns, "route", "add", "default", "via", g.host4)
            ip("-n", ns, "-6", "route", "add", "default", "via", g.host6)
        self.guests[role] = g
        return g


@dataclass
class Gateway:
    root: Path
    config: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def table(self) -> str:
        return default_table(self.state)

    def records(self) -> list[dict[str, Any]]:
        audit = self.state / "audit" / "audit.jsonl"
        lines = audit.read_text().splitlines() if audit.exists() else []
        return [json.loads(line) for line in lines if '"event":"decision"' in line]

    def log(self) -> str:
        path = self.root / "gateway.log"
        return path.read_text()[-3000:] if path.exists() else ""


@dataclass
class Lab:
    net: Net
    a: Gateway
    b: Gateway
    web4: RecordingUpstream
    web6: RecordingUpstream
    dns: ScriptedDNSServer

    def sandgate(self, gw: Gateway, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return netns_exec(self.net.gw, SANDGATE, *args, "--config", str(gw.config), timeout=timeout)

    def nft(self, *args: str) -> subprocess.CompletedProcess[str]:
        return netns_exec(self.net.gw, "nft", *args)


def netns_exec(ns: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=timeout, env=os.environ
    )


def start_gateway(net: Net, gw: Gateway) -> None:
    with (gw.root / "gateway.log").open("ab") as log:
        gw.proc = subprocess.Popen(
            ["ip", "netns", "exec", net.gw, SANDGATE, "run", "--config", str(gw.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60  # a gateway start on a loaded machine
    status = gw.state / "gateway.json"
    while time.monotonic() < deadline:
        if status.exists() and json.loads(status.read_text()).get("transparent_port"):
            return
        if gw.proc.poll() is not None:
            raise AssertionError(f"gateway exited {gw.proc.returncode}: {gw.log()}")
        time.sleep(0.2)
    raise AssertionError(f"gateway did not start: {gw.log()}")


def stop_gateway(gw: Gateway) -> None:
    if gw.proc is not None and gw.proc.poll() is None:
        gw.proc.terminate()
        try:
            gw.proc.wait(20)
        except subprocess.TimeoutExpired:
            gw.proc.kill()
            gw.proc.wait(5)


def gateway_files(root: Path, net: Net, tenants: dict[str, str], **extra: Any) -> Gateway:
    s = int(net.tag[:2], 16)
    config, _ = write_gateway_files(
        root,
        tenants,
        config={
            "listeners": [
                {"host": "127.0.0.1", "port": free_port()},
                # Every address of both families: IPv4 and IPv6 guests are redirected here.
                {"mode": "transparent", "host": "*", "port": free_port()},
            ],
            "dns": {"host": "*", "port": free_port()},
            "resolver": {"hosts": {}, "nameservers": [f"{net.up.addr4}:53"], "ipv6": True},
            "address_guard": {"reachable_by_name": [f"10.203.{s}.0/24", f"fd5a:{net.group6}::/32"]},
            **extra,
        },
    )
    return Gateway(root, config)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tag = secrets.token_hex(2)
    net = Net(tag, f"sghn-gw-{tag}", None, {}, [], [])  # type: ignore[arg-type]
    servers: list[Any] = []
    a = b = None
    try:
        ip("netns", "add", net.gw)
        net.namespaces.append(net.gw)
        ip("-n", net.gw, "link", "set", "lo", "up")
        net.up = net.guest("up", 0, route=False)
        g1, g2, g3 = net.guest("g1", 1), net.guest("g2", 2), net.guest("g3", 3)
        up = net.up
        web4 = in_namespace(up.ns, lambda: RecordingUpstream(up.addr4, 80, name="web4").start())
        servers.append(web4)
        web6 = in_namespace(up.ns, lambda: RecordingUpstream(up.addr6, 80, name="web6").start())
        servers.append(web6)
        records = {"api.test": [up.addr4, up.addr6], "v6only.test": [up.addr6]}
        dns = in_namespace(up.ns, lambda: ScriptedDNSServer(up.addr4, 53, records=records, ttl=60).start())
        servers.append(dns)
        t1 = tenant_yaml(
            "t1", [{"id": "api", "hosts": ["api.test", "v6only.test"], "ports": [80]}], sandbox="static-t1"
        )
        root = tmp_path_factory.mktemp("hostnet")
        a = gateway_files(root / "a", net, {"t1.yaml": t1})
        b = gateway_files(root / "b", net, {"t1.yaml": t1})
        # B's state_dir had a sandbox registered before: an older sandgate kept its rules in the
        # one shared table `inet sandgate`, which B's start must move to B's own table.
        b.state.mkdir(parents=True, exist_ok=True)
        (b.state / "sandboxes.json").write_text(
            json.dumps([{"id": "sb3", "tenant": "t1", "interface": g3.host_if, "address": g3.addr4}])
        )
        legacy = (
            "table inet sandgate {\n"
            "  set ifaces { type ifname; elements = { " + f'"{g3.host_if}"' + " }; }\n"
            "  set sources { type ifname . ipv4_addr; elements = { "
            + f'"{g3.host_if}" . {g3.addr4}'
            + " }; }\n"
            "  chain sg_input { type filter hook input priority filter; policy accept;\n"
            "    iifname @ifaces drop\n  }\n}\n"
        )
        subprocess.run(["ip", "netns", "exec", net.gw, "nft", "-f", "-"], input=legacy, text=True, check=True)
        start_gateway(net, a)
        start_gateway(net, b)
        for guest, sandbox in ((g1, "sb1"), (g2, "sb2")):
            added = netns_exec(
                net.gw, SANDGATE, "sandbox", "add", "--config", str(a.config), "--interface", guest.host_if,
                "--address", guest.addr4, "--address", guest.addr6, "--tenant", "t1", "--id", sandbox,
            )  # fmt: skip
            assert added.returncode == 0, added.stderr + a.log()
            # The nameserver is the gateway side's IPv6 address: queries go over IPv6.
            etc = Path("/etc/netns") / guest.ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "resolv.conf").write_text(f"nameserver {guest.host6}\noptions timeout:2 attempts:2\n")
        yield Lab(net, a, b, web4, web6, dns)
    finally:
        for gw in (a, b):
            if gw is not None:
                stop_gateway(gw)
        for server in servers:
            server.stop()
        for ns in net.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            etc = Path("/etc/netns") / ns
            if etc.exists():
                for f in etc.iterdir():
                    f.unlink()
                etc.rmdir()


def _sets(lab: Lab, table: str) -> dict[str, list[Any]]:
    listed = lab.nft("-j", "list", "table", "inet", table)
    assert listed.returncode == 0, listed.stderr
    out: dict[str, list[Any]] = {}
    for item in json.loads(listed.stdout)["nftables"]:
        if "set" in item:
            elems = item["set"].get("elem", [])
            out[item["set"]["name"]] = [e["concat"] if isinstance(e, dict) else e for e in elems]
    return out


def _wait_for(predicate: Any, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


# -- several addresses, both families -----------------------------------------------------------


def test_the_table_holds_every_address_of_a_sandbox_in_its_family_set(lab: Lab) -> None:
    g1, g2 = lab.net.guests["g1"], lab.net.guests["g2"]
    sets = _sets(lab, lab.a.table)
    assert sorted(map(tuple, sets["sources4"])) == sorted([(g1.host_if, g1.addr4), (g2.host_if, g2.addr4)])
    assert sorted(map(tuple, sets["sources6"])) == sorted([(g1.host_if, g1.addr6), (g2.host_if, g2.addr6)])
    assert sorted(sets["ifaces6"]) == sorted([g1.host_if, g2.host_if])
    # IPv6 stays on for an interface whose sandbox has an IPv6 address.
    sysctl = netns_exec(lab.net.gw, "sysctl", "-n", f"net.ipv6.conf.{g1.host_if}.disable_ipv6")
    assert sysctl.stdout.strip() == "0"
    listed = lab.sandgate(lab.a, "sandbox", "list", "--format", "json")
    sb1 = next(e for e in json.loads(listed.stdout) if e["id"] == "sb1")
    assert sb1["addresses"] == [g1.addr4, g1.addr6]


def test_an_ipv4_guest_reaches_the_upstream_through_the_transparent_listener(lab: Lab) -> None:
    g1 = lab.net.guests["g1"]
    got = netns_exec(g1.ns, "curl", "-4", "-sS", "-m", "10", "http://api.test/by-v4")
    assert got.returncode == 0, got.stderr + lab.a.log()
    assert json.loads(got.stdout)["path"] == "/by-v4"
    # The DNS listener on "*" answers over IPv4 as well.
    answer = netns_exec(g1.ns, PYTHON, "-c", DIG, g1.host4, "api.test", "A")
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.split() == [lab.net.up.addr4]
    assert _wait_for(
        lambda: any(r.get("path") == "/by-v4" and r["sandbox"] == "sb1" for r in lab.a.records())
    )


def test_an_ipv6_guest_resolves_aaaa_and_reaches_the_upstream_over_ipv6(lab: Lab) -> None:
    g1 = lab.net.guests["g1"]
    got = netns_exec(g1.ns, "curl", "-6", "-sS", "-m", "10", "http://v6only.test/by-v6")
    assert got.returncode == 0, got.stderr + lab.a.log()
    assert json.loads(got.stdout)["path"] == "/by-v6"
    assert [r.target for r in lab.web6.requests] == ["/by-v6"], "it arrived at the IPv6 upstream"
    # The request's record is written once the exchange completes (through the collector with
    # workers): wait for it rather than read the trail at once.
    assert _wait_for(lambda: any(r.get("path") == "/by-v6" for r in lab.a.records()))
    records = lab.a.records()
    # The AAAA query came in over IPv6 from sb1's IPv6 address and was answered.
    assert any(
        r.get("phase") == "dns"
        and r.get("method") == "AAAA"
        and r["sandbox"] == "sb1"
        and r["decision"] == "allow"
        for r in records
    )
    request = next(r for r in records if r.get("path") == "/by-v6")
    assert request["sandbox"] == "sb1" and request["client"].startswith(f"[{g1.addr6}]:")


def test_sb1s_ipv6_address_sent_from_another_interface_is_dropped(lab: Lab) -> None:
    g1, g2 = lab.net.guests["g1"], lab.net.guests["g2"]
    name = f"spoof-{secrets.token_hex(3)}.test"
    query = (
        "import socket,sys,dns.message\n"
        "q=dns.message.make_query(sys.argv[2],'AAAA').to_wire()\n"
        "s=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM)\n"
        "s.bind((sys.argv[1],0)); s.sendto(q,(sys.argv[3],53))\n"
    )
    # Control: from g1 itself the query reaches the gateway and is recorded for sb1 (denied name).
    sent = netns_exec(g1.ns, PYTHON, "-c", query, g1.addr6, f"control-{name}", g1.host6)
    assert sent.returncode == 0, sent.stderr
    assert _wait_for(lambda: any(r["dest"]["host"] == f"control-{name}" for r in lab.a.records()))
    # g2 takes sb1's IPv6 address and sends from it over its own link.
    ip("-n", g2.ns, "addr", "add", f"{g1.addr6}/128", "dev", f"hn2n-{lab.net.tag}", "nodad")
    try:
        sent = netns_exec(g2.ns, PYTHON, "-c", query, g1.addr6, name, g2.host6)
        assert sent.returncode == 0, sent.stderr
        # Then g2 from its own address, over the same link: once this query's record is there,
        # a spoofed query that got through would have been recorded (and is not).
        sent = netns_exec(g2.ns, PYTHON, "-c", query, g2.addr6, f"after-{name}", g2.host6)
        assert sent.returncode == 0, sent.stderr
        assert _wait_for(lambda: any(r["dest"]["host"] == f"after-{name}" for r in lab.a.records()))
    finally:
        ip("-n", g2.ns, "addr", "del", f"{g1.addr6}/128", "dev", f"hn2n-{lab.net.tag}")
    assert not [r for r in lab.a.records() if r["dest"]["host"] == name], (
        "the spoofed query reached the gateway"
    )


# -- one table per state directory ------------------------------------------------------------


def test_each_state_dir_has_its_own_table_and_an_older_shared_table_was_moved(lab: Lab) -> None:
    g3 = lab.net.guests["g3"]
    assert lab.a.table != lab.b.table
    # A started first and left the old table alone: none of its interfaces were A's.
    assert "host_rules.legacy_table_left" in (lab.a.root / "gateway.log").read_text()
    assert lab.nft("list", "table", "inet", "sandgate").returncode != 0, "B moved it: the old table is gone"
    assert _sets(lab, lab.b.table)["sources4"] == [[g3.host_if, g3.addr4]]
    owner = lab.nft("list", "table", "inet", lab.b.table).stdout
    assert f'comment "sandgate state_dir={lab.b.state.resolve()}"' in owner


def test_one_gateways_remove_leaves_the_other_gateways_table_alone(lab: Lab) -> None:
    before = _sets(lab, lab.a.table)
    removed = lab.sandgate(lab.b, "sandbox", "remove", "sb3")
    assert removed.returncode == 0, removed.stderr
    assert lab.nft("list", "table", "inet", lab.b.table).returncode != 0, "B had nothing left to guard"
    assert _sets(lab, lab.a.table) == before


def test_a_gateway_refuses_a_table_another_running_gateway_owns(lab: Lab, tmp_path: Path) -> None:
    t1 = tenant_yaml("t1", [{"id": "api", "hosts": ["api.test"], "ports": [80]}], sandbox="static-t1")
    c = gateway_files(tmp_path / "c", lab.net, {"t1.yaml": t1}, host_rules={"table": lab.a.table})
    started = netns_exec(lab.net.gw, SANDGATE, "run", "--config", str(c.config), timeout=60)
    assert started.returncode != 0
    assert (
        f"belongs to the running gateway of state_dir {lab.a.state.resolve()}"
        in started.stdout + started.stderr
    )
    g3 = lab.net.guests["g3"]
    added = lab.sandgate(
        c, "sandbox", "add", "--interface", g3.host_if, "--address", g3.addr4, "--tenant", "t1"
    )
    assert added.returncode != 0 and "belongs to the running gateway" in added.stderr
    assert (
        not (c.state / "sandboxes.json").exists()
        or json.loads((c.state / "sandboxes.json").read_text()) == []
    )
    assert len(_sets(lab, lab.a.table)["sources4"]) == 2, "A's table is untouched"


def test_an_address_nft_cannot_take_leaves_the_rules_and_registry_as_they_were(lab: Lab) -> None:
    g3 = lab.net.guests["g3"]
    before_rules = lab.nft("list", "table", "inet", lab.a.table).stdout
    before_registry = (lab.a.state / "sandboxes.json").read_text()
    added = lab.sandgate(
        lab.a, "sandbox", "add", "--interface", g3.host_if, "--address", "fe80::5", "--tenant", "t1"
    )
    assert added.returncode != 0 and "fe80::5 is link-local" in added.stderr
    taken = lab.sandgate(
        lab.a, "sandbox", "add", "--interface", g3.host_if, "--address", lab.net.guests["g1"].addr6,
        "--tenant", "t1", "--id", "sb9",
    )  # fmt: skip
    assert taken.returncode != 0 and "belongs to 'sb1'" in taken.stderr
    assert lab.nft("list", "table", "inet", lab.a.table).stdout == before_rules
    assert (lab.a.state / "sandboxes.json").read_text() == before_registry


def test_a_table_whose_owner_no_longer_runs_is_taken_over(lab: Lab, tmp_path: Path) -> None:
    stale = f"sghn_stale_{lab.net.tag}"
    old = f'table inet {stale} {{\n  comment "sandgate state_dir={tmp_path}/gone"\n  set ifaces {{ type ifname; }}\n}}\n'
    loaded = subprocess.run(["ip", "netns", "exec", lab.net.gw, "nft", "-f", "-"], input=old, text=True)
    assert loaded.returncode == 0
    t1 = tenant_yaml("t1", [{"id": "api", "hosts": ["api.test"], "ports": [80]}], sandbox="static-t1")
    c = gateway_files(tmp_path / "c", lab.net, {"t1.yaml": t1}, host_rules={"table": stale})
    g3 = lab.net.guests["g3"]
    added = lab.sandgate(
        c, "sandbox", "add", "--interface", g3.host_if, "--address", g3.addr4, "--tenant", "t1"
    )
    assert added.returncode == 0, added.stderr
    listed = lab.nft("list", "table", "inet", stale).stdout
    assert f'comment "sandgate state_dir={c.state.resolve()}"' in listed
    assert _sets(lab, stale)["sources4"] == [[g3.host_if, g3.addr4]]
    removed = lab.sandgate(c, "sandbox", "remove", g3.host_if.lower())
    assert removed.returncode == 0, removed.stderr
    assert lab.nft("list", "table", "inet", stale).returncode != 0
