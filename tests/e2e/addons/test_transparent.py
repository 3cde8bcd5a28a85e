"""Transparent mode in real network namespaces: guests without proxy settings behind the gateway.

Topology (all addresses exist only in namespaces this module creates):
  up    the upstream host: HTTP :80, HTTPS :443 (test PKI), raw TCP :5432, DNS :53
  evil  another host a guest might try to reach directly with an allowed name
  g1    guest of tenant t1;  g2  guest of tenant t2
The gateway runs on the host with an explicit, a transparent and a DNS listener; the guests
are registered with `sandgate sandbox add`, which installs sandgate's nftables table.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SANDGATE, records_when, tenant_yaml, wait_quiet, write_gateway_files
from support import RecordingUpstream, ScriptedDNSServer, TestPKI, free_port, wait_for_port
from support.netns import Namespace, NetnsLab, in_namespace, netns_lab, tcp_echo_server

pytestmark = [pytest.mark.root, pytest.mark.slow]

NAMES = ["api.test", "pass.test", "open.test"]


@dataclass
class Lab:
    lab: NetnsLab
    up: Namespace
    evil: Namespace
    g1: Namespace
    g2: Namespace
    root: Path
    config: Path
    gateway: subprocess.Popen[bytes]
    web: RecordingUpstream
    tls: RecordingUpstream
    evil_web: RecordingUpstream
    evil_tls: RecordingUpstream
    dns: ScriptedDNSServer
    pki: TestPKI

    @property
    def table(self) -> str:
        return f"sgt_{self.lab.tag}"

    @property
    def audit(self) -> Path:
        return self.root / "state" / "audit" / "audit.jsonl"

    @property
    def gateway_ca(self) -> Path:
        return self.root / "state" / "ca" / "mitmproxy-ca-cert.pem"

    def records(
        self, since: int = 0, done: Callable[[list[dict[str, Any]]], bool] | None = None
    ) -> list[dict[str, Any]]:
        """Decision records after line `since`: once `done` holds for them, or (without it) once
        the audit file has been still for a moment (the writer thread flushes asynchronously)."""

        def read() -> list[dict[str, Any]]:
            lines = self.audit.read_text().splitlines()[since:] if self.audit.exists() else []
            return [json.loads(line) for line in lines if '"event":"decision"' in line]

        if done is None:
            wait_quiet(self.audit, 0.3)
            return read()
        return records_when(read, done)

    def mark(self) -> int:
        wait_quiet(self.audit, 0.3)  # an earlier test's records are written before the mark
        return len(self.audit.read_text().splitlines()) if self.audit.exists() else 0

    def sandgate(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the CLI with this lab's config (placed before any `--` command)."""
        cut = args.index("--") if "--" in args else len(args)
        argv = [SANDGATE, *args[:cut], "--config", str(self.config), *args[cut:]]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def curl(self, guest: Namespace, *args: str) -> subprocess.CompletedProcess[str]:
        return guest.exec("curl", "-sS", "-m", "8", *args, timeout=30)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("transparent")
    with netns_lab() as nl:
        up, evil, g1, g2 = nl.add("up"), nl.add("evil"), nl.add("g1"), nl.add("g2")
        web = in_namespace(up.name, lambda: RecordingUpstream(up.addr, 80, name="web").start())
        tls = in_namespace(up.name, lambda: RecordingUpstream(up.addr, 443, tls=pki, name="tls").start())
        evil_web = in_namespace(evil.name, lambda: RecordingUpstream(evil.addr, 80, name="evil-web").start())
        evil_tls = in_namespace(
            evil.name, lambda: RecordingUpstream(evil.addr, 443, tls=pki, name="evil-tls").start()
        )
        records = {name: [up.addr] for name in NAMES}
        # Allowed names the guard must refuse: the metadata address, the gateway's own veth address.
        records |= {"meta.test": ["169.254.169.254"], "gw.test": [g1.host_addr]}
        dns = in_namespace(up.name, lambda: ScriptedDNSServer(up.addr, 53, records=records, ttl=60).start())
        stop_echo = in_namespace(up.name, lambda: tcp_echo_server(up.addr, 5432))
        t1 = tenant_yaml(
            "t1",
            [
                {"id": "api", "hosts": ["api.test"], "ports": [80, 443], "inspect": True},
                {"id": "pass", "hosts": ["pass.test"], "ports": [443]},
                {"id": "db", "cidrs": [f"{up.addr}/32"], "ports": [5432], "protocol": "tcp"},
                {"id": "traps", "hosts": ["meta.test", "gw.test"], "ports": [80]},
                {"id": "wide", "hosts": ["*.wide.test"], "ports": [443]},
            ],
            sandbox="static-sb1",
            # Refused outright (no ports, methods or paths): never looked up either.
            deny=[{"id": "no-evil", "hosts": ["*.evil.wide.test"]}],
        )
        t2 = tenant_yaml("t2", [{"id": "pass", "hosts": ["pass.test"], "ports": [443]}], sandbox="static-sb2")
        transparent_port, dns_port = free_port(), free_port()
        config, _ = write_gateway_files(
            root,
            {"t1.yaml": t1, "t2.yaml": t2},
            config={
                "listeners": [
                    {"host": "127.0.0.1", "port": free_port()},
                    {"mode": "transparent", "host": "0.0.0.0", "port": transparent_port},
                ],
                "dns": {"host": "0.0.0.0", "port": dns_port},
                "resolver": {"hosts": {}, "nameservers": [f"{up.addr}:53"], "ipv6": False},
                "address_guard": {
                    "reachable_by_name": [f"10.200.{nl.subnet}.0/24"],
                    # The raw-TCP database by address (rule db): the operator opens it, the rule names it.
                    "tenant_reachable": [f"{up.addr}/32"],
                },
                "upstream": {"trusted_ca": str(pki.ca_file)},
                # A table of its own: concurrent test runs on one host must not replace each other's.
                "host_rules": {"table": f"sgt_{nl.tag}"},
                # Low enough for a test to reach (see the per-sandbox cap test).
                "connections": {"max_per_sandbox": 40},
            },
        )
        with (root / "gateway.log").open("wb") as log:
            gateway = subprocess.Popen(
                [SANDGATE, "run", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        try:
            wait_for_port("127.0.0.1", transparent_port, timeout=30)
            for guest, sandbox, tenant in ((g1, "sb1", "t1"), (g2, "sb2", "t2")):
                result = subprocess.run(
                    [
                        SANDGATE,
                        "sandbox",
                        "add",
                        "--interface",
                        guest.host_if,
                        "--address",
                        guest.addr,
                        "--tenant",
                        tenant,
                        "--id",
                        sandbox,
                        "--config",
                        str(config),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert result.returncode == 0, result.stderr
                guest.resolv_conf(guest.host_addr)
            _wait_for_registry(root, 2)
            yield Lab(nl, up, evil, g1, g2, root, config, gateway, web, tls, evil_web, evil_tls, dns, pki)
        finally:
            for sandbox in ("sb1", "sb2"):
                subprocess.run(
                    [SANDGATE, "sandbox", "remove", sandbox, "--config", str(config)], capture_output=True
                )
            gateway.terminate()
            gateway.wait(20)
            for server in (web, tls, evil_web, evil_tls, dns):
                server.stop()
            stop_echo()
            subprocess.run(["nft", "delete", "table", "inet", f"sgt_{nl.tag}"], capture_output=True)


def _wait_for_registry(root: Path, count: int) -> None:
    status = root / "state" / "gateway.json"
    deadline = time.monotonic() + 30  # a gateway start under load
    while time.monotonic() < deadline:
        if status.exists() and "+" in json.loads(status.read_text()).get("policy_version", ""):
            registry = json.loads((root / "state" / "sandboxes.json").read_text())
            if len(registry) == count:
                return
        time.sleep(0.1)
    raise AssertionError("gateway did not load the sandbox registry")


def test_a_guest_without_proxy_settings_reaches_an_allowed_http_host(lab: Lab) -> None:
    lab.web.reset()
    result = lab.curl(lab.g1, "http://api.test/hello")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["server"] == "web"
    (req,) = lab.web.requests
    assert req.header("Host") == "api.test"


def test_passthrough_https_reaches_the_pinned_upstream_untouched(lab: Lab) -> None:
    lab.tls.reset()
    result = lab.curl(lab.g1, "--cacert", str(lab.pki.ca_file), "https://pass.test/")
    assert result.returncode == 0, result.stderr
    assert lab.tls.connections[0].sni == "pass.test"


def test_intercepted_https_is_decided_per_request(lab: Lab) -> None:
    result = lab.curl(lab.g1, "--cacert", str(lab.gateway_ca), "https://api.test/v1/x")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["server"] == "tls"


def test_dns_for_a_denied_name_is_nxdomain_audited_and_never_forwarded(lab: Lab) -> None:
    lab.dns.reset()
    mark = lab.mark()
    secret = secrets.token_hex(20)
    for name in ("open.test", f"{secret}.api.test"):
        result = lab.curl(lab.g1, f"http://{name}/")
        assert result.returncode == 6, "curl could not resolve the name"
    expected = {("open.test", "dns_denied"), (f"{secret}.api.test", "dns_denied")}

    def dns_reasons(records: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {(r["dest"]["host"], r["reason"]) for r in records if r["phase"] == "dns"}

    assert dns_reasons(lab.records(mark, lambda rs: dns_reasons(rs) >= expected)) >= expected
    assert not any(secret in q.name for q in lab.dns.queries), "the exfil label never left the gateway"
    assert lab.dns.count("open.test") == 0


def test_dns_for_an_allowed_name_at_a_refused_address_is_audited_private_address(lab: Lab) -> None:
    """The guest gets no address, and the record says why (not `dns allow allowed`)."""
    mark = lab.mark()
    for name in ("meta.test", "gw.test"):
        result = lab.curl(lab.g1, f"http://{name}/")
        assert result.returncode == 6, f"curl got no address for {name}"
    records = {
        r["dest"]["host"]: r
        for r in lab.records(mark, lambda rs: {"meta.test", "gw.test"} <= {r["dest"]["host"] for r in rs})
        if r["phase"] == "dns" and r["method"] == "A"
    }
    assert {n: (records[n]["decision"], records[n]["reason"]) for n in ("meta.test", "gw.test")} == {
        "meta.test": ("deny", "private_address"),
        "gw.test": ("deny", "private_address"),
    }
    assert "169.254.169.254 is a metadata address" in records["meta.test"]["detail"]
    assert f"{lab.g1.host_addr} is an address of the gateway itself" in records["gw.test"]["detail"]


def test_a_guest_dialling_an_ip_the_gateway_did_not_give_it_is_refused(lab: Lab) -> None:
    lab.evil_tls.reset()
    lab.evil_web.reset()
    mark = lab.mark()
    tls = lab.curl(
        lab.g1,
        "--cacert",
        str(lab.pki.ca_file),
        "--resolve",
        f"pass.test:443:{lab.evil.addr}",
        "https://pass.test/",
    )
    http = lab.curl(
        lab.g1,
        "--resolve",
        f"api.test:80:{lab.evil.addr}",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "http://api.test/",
    )
    assert tls.returncode != 0
    assert http.stdout == "403"
    assert lab.evil_tls.connections == [] and lab.evil_web.connections == []
    expected = {("tls", "host_mismatch"), ("request", "host_mismatch")}
    records = lab.records(mark, lambda rs: expected <= {(r["phase"], r["reason"]) for r in rs})
    reasons = [(r["phase"], r["reason"]) for r in records]
    assert ("tls", "host_mismatch") in reasons and ("request", "host_mismatch") in reasons


def test_raw_tcp_passes_only_where_a_tcp_rule_allows_it(lab: Lab) -> None:
    mark = lab.mark()
    script = (
        "import socket,sys\n"
        "def talk(port):\n"
        "    try:\n"
        f"        s=socket.create_connection(('{lab.up.addr}',port),timeout=3); s.sendall(b'ping'); s.settimeout(3)\n"
        "        data=b''\n"
        "        while b'ECHO' not in data:\n"
        "            chunk=s.recv(100)\n"
        "            if not chunk: break\n"
        "            data+=chunk\n"
        "        return data.decode()\n"
        "    except OSError as e: return 'error'\n"
        "print(repr(talk(5432))); print(repr(talk(6000)))\n"
    )
    result = lab.g1.exec("python3", "-c", script)
    allowed, denied = result.stdout.splitlines()
    assert "HELLO sandgate-db" in allowed and "ECHO ping" in allowed
    assert "ECHO" not in denied
    expected = {(5432, "allowed"), (6000, "protocol_not_allowed")}
    records = lab.records(mark, lambda rs: expected <= {(r["dest"]["port"], r["reason"]) for r in rs})
    reasons = {(r["dest"]["port"], r["reason"]) for r in records}
    assert (5432, "allowed") in reasons and (6000, "protocol_not_allowed") in reasons


def test_udp_and_quic_are_dropped_by_the_host_rules(lab: Lab) -> None:
    received: list[bytes] = []

    def listen() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((lab.up.addr, 443))
        s.settimeout(0.1)
        return s

    sock = in_namespace(lab.up.name, listen)
    try:
        lab.g1.exec(
            "python3",
            "-c",
            f"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            f"[s.sendto(b'quic-initial', ('{lab.up.addr}', 443)) for _ in range(5)]",
        )
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                received.append(sock.recv(100))
    finally:
        sock.close()
    assert received == []


def test_a_guest_spoofing_another_sandboxs_address_is_dropped(lab: Lab) -> None:
    mark = lab.mark()
    ip_dev = lab.g2.ns_if
    subprocess.run(["ip", "-n", lab.g2.name, "addr", "add", f"{lab.g1.addr}/32", "dev", ip_dev], check=True)
    try:
        result = lab.curl(lab.g2, "--interface", lab.g1.addr, "-m", "3", "http://api.test/")
    finally:
        subprocess.run(
            ["ip", "-n", lab.g2.name, "addr", "del", f"{lab.g1.addr}/32", "dev", ip_dev], check=True
        )
    assert result.returncode != 0
    assert all(r["sandbox"] != "sb1" for r in lab.records(mark)), "nothing was attributed to sandbox 1"


def test_two_tenants_at_once_each_see_only_their_own_policy(lab: Lab) -> None:
    mark = lab.mark()
    g1_api = lab.curl(lab.g1, "-o", "/dev/null", "-w", "%{http_code}", "http://api.test/")
    g2_api = lab.curl(lab.g2, "-o", "/dev/null", "-w", "%{http_code}", "http://api.test/")
    g2_pass = lab.curl(lab.g2, "--cacert", str(lab.pki.ca_file), "https://pass.test/")
    assert g1_api.stdout == "200"
    assert g2_api.returncode == 6, "tenant t2 cannot even resolve api.test"
    assert g2_pass.returncode == 0
    both = {("sb1", "t1"), ("sb2", "t2")}
    records = lab.records(mark, lambda rs: both <= {(r["sandbox"], r["tenant"]) for r in rs})
    by_sandbox = {(r["sandbox"], r["tenant"]) for r in records}
    assert by_sandbox == {("sb1", "t1"), ("sb2", "t2")}


def test_ipv6_from_a_guest_goes_nowhere(lab: Lab) -> None:
    sysctl = Path(f"/proc/sys/net/ipv6/conf/{lab.g1.host_if}/disable_ipv6").read_text().strip()
    assert sysctl == "1"
    ruleset = subprocess.run(
        ["nft", "list", "table", "inet", lab.table], capture_output=True, text=True
    ).stdout
    # The interface's sandbox has no IPv6 address: the interface is not in ifaces6, so all its IPv6 drops.
    assert "meta nfproto ipv6 iifname != @ifaces6 drop" in ruleset
    assert lab.g1.host_if not in ruleset.split("set ifaces6")[1].split("}")[0]


def test_sandbox_list_shows_registrations(lab: Lab) -> None:
    result = lab.sandgate("sandbox", "list", "--format", "json")
    entries = {e["id"]: e for e in json.loads(result.stdout)}
    assert entries["sb1"]["interface"] == lab.g1.host_if and entries["sb1"]["tenant"] == "t1"


# -- sandgate jail -------------------------------------------------------------------------------


def _jail_resources() -> set[str]:
    """Jail namespaces and host links that exist now."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found = {n for n in netns.split() if n.startswith("sgj-")}
    return found | {w.split("@")[0].rstrip(":") for w in links.split() if w.startswith("sgjh-")}


def _ruleset() -> str:
    return subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True).stdout


@pytest.fixture
def no_jail_left(one_jail_at_a_time: None) -> Iterator[None]:
    """After the test, no jail namespace, link or rule that it created is left behind."""
    before = _jail_resources()
    yield
    # Names are global: another test run's jail may be up right now. A leak stays; theirs go.
    deadline = time.monotonic() + 30
    while (left := _jail_resources() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == set(), f"left behind: {left}"
    assert not any(name in _ruleset() for name in left)


@pytest.mark.usefixtures("no_jail_left")
def test_jail_runs_a_command_behind_the_running_gateway(lab: Lab) -> None:
    lab.web.reset()
    result = lab.sandgate(
        "jail", "--tenant", "t1", "--", "curl", "-sS", "-m", "8", "http://api.test/from-jail"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["path"] == "/from-jail"
    listed = json.loads(lab.sandgate("sandbox", "list", "--format", "json").stdout)
    assert {e["id"] for e in listed if e["defined_in"].startswith("registry ")} == {"sb1", "sb2"}


@pytest.mark.usefixtures("no_jail_left")
def test_jail_returns_the_command_exit_code_and_its_denials(lab: Lab) -> None:
    assert lab.sandgate("jail", "--tenant", "t1", "--", "sh", "-c", "exit 7").returncode == 7
    denied = lab.sandgate("jail", "--tenant", "t1", "--", "curl", "-sS", "-m", "5", "http://open.test/")
    assert denied.returncode == 6


@pytest.mark.usefixtures("no_jail_left")
def test_jail_cleans_up_when_it_is_terminated(lab: Lab, tmp_path: Path) -> None:
    before = _jail_resources()  # before the jail starts: it may create its namespace at once
    with (tmp_path / "jail.err").open("wb") as err:
        proc = subprocess.Popen(
            [SANDGATE, "jail", "--config", str(lab.config), "--tenant", "t1", "--", "sleep", "60"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    # Generous: the jail waits for the gateway to take its registration (host rules, a
    # reload), which on a loaded 2-core machine was seen to take over 30 s.
    # The command itself, not a setup step the jail runs in its namespace for a moment (seen
    # there once, then gone by a second look).
    deadline = time.monotonic() + 90
    while (
        time.monotonic() < deadline
        and not (jailed := _jailed_command(_jail_resources() - before, b"sleep"))
        and proc.poll() is None
    ):
        time.sleep(0.1)
    if not jailed:
        exited = proc.poll()
        proc.terminate()  # the jail cleans up on SIGTERM
        proc.wait(30)
        raise AssertionError(
            f"the command did not run in a jail (jail exit: {exited}, resources now: "
            f"{sorted(_jail_resources() - before)}): {(tmp_path / 'jail.err').read_text()}"
        )
    proc.send_signal(signal.SIGTERM)  # forwarded to the command, which dies of it
    assert proc.wait(30) == 128 + signal.SIGTERM


@pytest.mark.usefixtures("one_jail_at_a_time")
def test_jail_terminated_while_setting_up_exits_with_sigterms_code(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real SIGTERM while setup runs (before the command): 128+15, not SIGINT's 130 as it said."""
    from sandgate.proxy.cli import jail
    from sandgate.proxy.config import load_config

    cleaned: list[bool] = []

    def setup_interrupted(self: jail.Jail) -> dict[str, str]:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler raises first
        raise AssertionError("SIGTERM did not interrupt the setup")

    monkeypatch.setattr(jail.Jail, "setup", setup_interrupted)
    monkeypatch.setattr(jail.Jail, "cleanup", lambda self: cleaned.append(True))
    config = load_config(lab.config)
    before = signal.getsignal(signal.SIGTERM)
    assert jail.run_jail(config, ["true"], tenant="t1", sandbox=None) == 128 + signal.SIGTERM
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is before  # put back as it was


def _jailed_command(names: set[str], program: bytes) -> list[str]:
    """Processes running `program` in the jail namespaces among `names`."""
    found = []
    for pid in _jailed_pids(names):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue  # gone meanwhile
        if Path(argv0.decode(errors="replace")).name.encode() == program:
            found.append(pid)
    return found


def _jailed_pids(names: set[str]) -> list[str]:
    """Processes running in the jail namespaces among `names`."""
    pids: list[str] = []
    for name in sorted(n for n in names if n.startswith("sgj-")):
        pids += subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
    return pids


def test_jail_needs_root(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Runs in-process with geteuid reporting a non-root user: this Python cannot run as one here."""
    from sandgate.proxy.cli.main import main

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["jail", "--", "true"]) == 2
    assert "needs root" in capsys.readouterr().err


@pytest.mark.usefixtures("no_jail_left")
def test_jail_starts_a_gateway_of_its_own_when_none_runs(lab: Lab, tmp_path: Path) -> None:
    config = yaml.safe_load(lab.config.read_text())
    config["state_dir"] = str(tmp_path / "state")
    config["host_rules"] = {"table": f"{lab.table}_own"}  # its own table: the lab's stays in force
    own = tmp_path / "sandgate.yaml"
    own.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [
            SANDGATE,
            "jail",
            "--config",
            str(own),
            "--tenant",
            "t1",
            "--",
            "curl",
            "-sS",
            "-m",
            "8",
            "http://api.test/own-gateway",
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["path"] == "/own-gateway"
    assert not (tmp_path / "state" / "gateway.json").exists(), "the jail's gateway stopped with it"
    audit = (tmp_path / "state" / "audit" / "audit.jsonl").read_text()
    assert '"path":"/own-gateway"' in audit
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert f"{lab.table}_own" not in tables, "the last jail removed its table"
    assert f"inet {lab.table}\n" in tables + "\n", "and left the other gateway's table alone"


DNS_PROBE = """
import json, socket, struct, sys
import dns.message, dns.query, dns.rcode
server = sys.argv[1]
out = {}
def ask(name, rdtype, tcp=False):
    q = dns.message.make_query(name, rdtype)
    r = (dns.query.tcp if tcp else dns.query.udp)(q, server, timeout=3)
    return dns.rcode.to_text(r.rcode()), sorted(rr.to_text() for rrset in r.answer for rr in rrset)
out["udp_a"] = ask("api.test", "A")
out["tcp_a"] = ask("api.test", "A", tcp=True)
out["txt"] = ask("api.test", "TXT")
out["denied_txt"] = ask("open.test", "TXT")
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
s.sendto(b"\\x12\\x34" + b"\\xff" * 20, (server, 53))
reply = s.recv(512)
out["garbage"] = [struct.unpack("!H", reply[:2])[0], reply[3] & 0x0F]
s.sendto(dns.message.make_query("api.test", "A").to_wire() + b"\\x00" * 600, (server, 53))
reply = s.recv(512)
out["oversize"] = reply[3] & 0x0F
print(json.dumps(out))
"""


def test_the_dns_listener_answers_only_what_it_should(lab: Lab) -> None:
    import sys

    lab.dns.reset()
    result = lab.g1.exec(sys.executable, "-c", DNS_PROBE, lab.g1.host_addr)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["udp_a"] == ["NOERROR", [lab.up.addr]]
    assert out["tcp_a"] == ["NOERROR", [lab.up.addr]], "DNS over TCP is answered too"
    assert out["txt"] == ["NOERROR", []], "other record types get no data, nothing is forwarded"
    assert out["denied_txt"] == ["NXDOMAIN", []]
    assert out["garbage"] == [0x1234, 1], "a malformed query gets FORMERR"
    assert out["oversize"] == 1
    assert {q.rdtype for q in lab.dns.queries} <= {"A", "AAAA"}, (
        "only A/AAAA ever reach the upstream resolver"
    )


def test_a_connect_through_the_transparent_listener_is_refused(lab: Lab) -> None:
    # mitmproxy refuses CONNECT on a transparent HTTP connection before any hook (400); the
    # Gate would refuse it too (protocol_not_allowed). Either way no tunnel is opened.
    lab.tls.reset()
    result = lab.curl(
        lab.g1,
        "-p",
        "-x",
        f"http://{lab.up.addr}:80",
        "-o",
        "/dev/null",
        "-w",
        "%{http_connect}",
        "https://pass.test/",
    )
    assert result.stdout in ("400", "403")
    assert lab.tls.connections == []


@pytest.mark.usefixtures("no_jail_left")
def test_jail_reports_a_killed_command_and_still_cleans_up(lab: Lab) -> None:
    result = lab.sandgate("jail", "--tenant", "t1", "--", "sh", "-c", "kill -KILL $$")
    assert result.returncode == 128 + signal.SIGKILL


def _connect(addr: str, port: int, count: int) -> list[socket.socket]:
    """`count` TCP connections that send nothing (run inside a guest's namespace)."""
    conns = []
    for _ in range(count):
        s = socket.create_connection((addr, port), timeout=5)
        conns.append(s)
    return conns


def _closed_soon(conns: list[socket.socket], wait: float) -> int:
    """How many of `conns` the gateway closes within `wait` seconds (they sent nothing)."""
    closed = 0
    deadline = time.monotonic() + wait
    for s in conns:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if s.recv(1) == b"":
                closed += 1
        except TimeoutError:
            pass
        except OSError:
            closed += 1
    return closed


def test_a_sandbox_past_its_connection_cap_is_closed_at_connect(lab: Lab) -> None:
    mark = lab.mark()
    conns = in_namespace(lab.g1.name, lambda: _connect(lab.up.addr, 80, 45))
    try:
        assert _closed_soon(conns[40:], wait=2) == 5
        assert _closed_soon(conns[:40], wait=0.2) == 0
        # Another sandbox is not affected.
        g2 = lab.curl(lab.g2, "--cacert", str(lab.pki.ca_file), "https://pass.test/")
        assert g2.returncode == 0, g2.stderr
    finally:
        for s in conns:
            s.close()

    def refused(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r["reason"] == "connection_limit"]

    # Refusals are recorded once a second, aggregated.
    refusals = refused(lab.records(mark, lambda rs: sum(r["connections"] for r in refused(rs)) >= 5))
    assert [(r["sandbox"], r["tenant"], r["detail"]) for r in refusals] == [
        ("sb1", "t1", "connections.max_per_sandbox (40)")
    ]
    assert refusals[0]["connections"] == 5
    # The slots are free again.
    assert lab.curl(lab.g1, "-o", "/dev/null", "-w", "%{http_code}", "http://api.test/").stdout == "200"


def test_a_clienthello_without_sni_never_reaches_a_host_allowed_by_name(lab: Lab) -> None:
    # pass.test (allowed by name, passed through) lives at up's address; no SNI means no name,
    # so the connection is decided by address alone and a fronted Host never gets there.
    lab.tls.reset()
    mark = lab.mark()
    result = lab.curl(lab.g1, "-k", "-H", "Host: other.test", f"https://{lab.up.addr}/fronted")
    assert result.returncode != 0
    tls = [
        r for r in lab.records(mark, lambda rs: any(r["phase"] == "tls" for r in rs)) if r["phase"] == "tls"
    ]
    assert [(r["decision"], r["dest"]["sni"]) for r in tls] == [("deny", None)]
    assert lab.tls.connections == []


def test_a_name_a_deny_rule_refuses_is_never_looked_up(lab: Lab) -> None:
    # `*.wide.test` is allowed and `*.evil.wide.test` denied outright. A lookup of a name under
    # it would carry its labels to that zone's nameservers, so the gateway makes none: not for
    # the guest's DNS query, nor for a name that comes only in the SNI of a connection to an
    # allowed address (the binding check resolves names it was not asked for otherwise).
    lab.dns.reset()
    lab.tls.reset()
    mark = lab.mark()
    secret = secrets.token_hex(20)
    name = f"{secret}.evil.wide.test"
    assert lab.curl(lab.g1, f"https://{name}/").returncode == 6, "curl could not resolve the name"
    result = lab.curl(lab.g1, "--resolve", f"{name}:443:{lab.up.addr}", f"https://{name}/")
    assert result.returncode != 0

    def seen(records: list[dict[str, Any]]) -> bool:
        return {r["phase"] for r in records if r["dest"]["host"] == name} >= {"dns", "tls"}

    records = [r for r in lab.records(mark, seen) if r["dest"]["host"] == name]
    # (curl asks for A and AAAA: one DNS record each.)
    assert {(r["phase"], r["reason"], r["rule_id"]) for r in records} == {
        ("dns", "dns_denied", "t1/deny/no-evil"),
        ("tls", "host_denied", "t1/deny/no-evil"),
    }
    assert not any(secret in q.name for q in lab.dns.queries), "the name was looked up"
    assert lab.tls.connections == []
