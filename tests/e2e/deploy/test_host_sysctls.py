"""deploy/sysctl/90-sandgate.conf: with it applied on the host, `sandgate sandbox add` works
where containers put it (a read-only /proc/sys); without it, registration fails clearly.

Each test builds that place for real: a fresh network namespace (its own sysctls, interfaces
and nftables) and a private mount namespace in which /proc/sys is bind-mounted read-only, as
container runtimes do; the host file is applied in the network namespace with sysctl(8)."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SANDGATE, tenant_yaml
from support.deployfiles import DEPLOY

from sandgate.proxy.state.table_name import default_table

HOST_FILE = DEPLOY / "sysctl" / "90-sandgate.conf"
# A container's view: /proc/sys read-only (the mount is private to this command).
READ_ONLY_PROC_SYS = 'mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$@"'


def in_ns(ns: str, *argv: str, read_only_proc_sys: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", "netns", "exec", ns]
    if read_only_proc_sys:
        cmd += ["unshare", "--mount", "--propagation", "private", "sh", "-c", READ_ONLY_PROC_SYS, "sh"]
    return subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=60)


def sysctl(ns: str, key: str) -> str:
    return in_ns(ns, "sysctl", "-n", key).stdout.strip()


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh network namespace with the kernel's permissive values set explicitly."""
    ns = f"sgs{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
    try:
        for key in ("net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter"):
            assert in_ns(ns, "sysctl", "-q", "-w", f"{key}=0").returncode == 0
        for key in ("net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"):
            assert in_ns(ns, "sysctl", "-q", "-w", f"{key}=0").returncode == 0
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, timeout=30)


def add_interface(ns: str) -> str:
    """A veth pair in the namespace (the sandbox's TAP stand-in); returns the host side."""
    assert in_ns(ns, "ip", "link", "add", "sbx0", "type", "veth", "peer", "name", "sbx0g").returncode == 0
    return "sbx0"


def sandbox_add(tmp_path: Path, ns: str, interface: str) -> subprocess.CompletedProcess[str]:
    """`sandgate sandbox add` for the interface, run as a container runs it."""
    (tmp_path / "rules" / "tenants").mkdir(parents=True, exist_ok=True)
    (tmp_path / "rules" / "tenants" / "t1.yaml").write_text(tenant_yaml("t1", [{"hosts": ["api.test"]}]))
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "listeners: [{mode: transparent, host: 0.0.0.0, port: 8081}]\n"
        f"dns: {{host: 0.0.0.0, port: 8053}}\nrules_dir: {tmp_path / 'rules'}\nstate_dir: {tmp_path / 'state'}\n"
    )
    argv = [SANDGATE, "sandbox", "add", "--config", str(config), "--interface", interface]
    return in_ns(ns, *argv, "--address", "10.213.0.2", "--tenant", "t1", read_only_proc_sys=True)


@pytest.mark.root
def test_without_the_host_settings_a_read_only_proc_sys_refuses_the_sandbox(
    tmp_path: Path, netns: str
) -> None:
    interface = add_interface(netns)
    probe = in_ns(
        netns, "sh", "-c", f"echo 1 > /proc/sys/net/ipv4/conf/{interface}/rp_filter", read_only_proc_sys=True
    )
    assert probe.returncode != 0 and "Read-only file system" in probe.stderr, "the namespace is not read-only"
    result = sandbox_add(tmp_path, netns, interface)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    # The error names the host setting, and the shipped host file sets exactly that.
    wanted = "net.ipv4.conf.all.rp_filter=1 on the host"
    assert wanted in result.stderr, result.stderr
    assert "net.ipv4.conf.all.rp_filter = 1" in HOST_FILE.read_text()
    assert not (tmp_path / "state" / "sandboxes.json").exists(), "nothing is registered"
    assert in_ns(netns, "nft", "list", "table", "inet", default_table(tmp_path / "state")).returncode != 0


@pytest.mark.root
@pytest.mark.parametrize(
    "ipv6_key",
    ["net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"],
    ids=["as shipped (IPv6 off on the host)", "the manual's variant that keeps IPv6 on existing interfaces"],
)
def test_with_the_host_settings_a_read_only_proc_sys_registers_the_sandbox(
    tmp_path: Path, netns: str, ipv6_key: str
) -> None:
    host_file = tmp_path / "90-sandgate.conf"
    host_file.write_text(HOST_FILE.read_text().replace("net.ipv6.conf.all.disable_ipv6 =", f"{ipv6_key} ="))
    applied = in_ns(netns, "sysctl", "-p", str(host_file))
    assert applied.returncode == 0, applied.stderr
    interface = add_interface(netns)  # the VMM makes the TAP after the host is set up
    result = sandbox_add(tmp_path, netns, interface)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "state" / "sandboxes.json").exists()
    assert in_ns(netns, "nft", "list", "table", "inet", default_table(tmp_path / "state")).returncode == 0
    # What the settings are for: strict reverse-path filtering and no IPv6 on the interface.
    rp = max(
        int(sysctl(netns, "net.ipv4.conf.all.rp_filter")),
        int(sysctl(netns, f"net.ipv4.conf.{interface}.rp_filter")),
    )
    assert rp == 1
    assert sysctl(netns, f"net.ipv6.conf.{interface}.disable_ipv6") == "1"
    host_wide = "1" if ipv6_key.endswith("all.disable_ipv6") else "0"
    assert sysctl(netns, "net.ipv6.conf.all.disable_ipv6") == host_wide
