"""deploy/systemd/sandgate.service: systemd accepts it, its hardening holds, and sandgate runs
under the restrictions it sets (W^X memory; a non-root user with only CAP_NET_ADMIN)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import SANDGATE, UPSTREAM_IP, curl, tenant_yaml, write_gateway_files
from support import RecordingUpstream, wait_for_port
from support.deployfiles import DEPLOY, env_refs, file_refs, parse_cli, under, unit_entries

from sandgate.proxy.config import load_config
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.state.table_name import default_table
from sandgate.proxy.stores.sealing_keys import StoreKeys

UNIT = DEPLOY / "systemd" / "sandgate.service"
VENV = Path(SANDGATE).parent.parent
NOBODY = 65534

# Sets the kernel's "memory deny write execute" (PR_SET_MDWE, REFUSE_EXEC_GAIN), which
# systemd's MemoryDenyWriteExecute= also enforces, then execs the command under it.
MDWE_LAUNCHER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(65, 1, 0, 0, 0) != 0 or libc.prctl(66, 0, 0, 0, 0) != 1:
    raise SystemExit("PR_SET_MDWE: " + os.strerror(ctypes.get_errno()))
os.execv(sys.argv[1], sys.argv[1:])
"""


def service() -> dict[str, list[str]]:
    return unit_entries(UNIT)["Service"]


def one(key: str) -> str:
    values = service()[key]
    assert len(values) == 1, (key, values)
    return values[0]


def test_execstart_is_a_real_command_line_and_reload_sends_sighup() -> None:
    argv = one("ExecStart").split()
    args = parse_cli(argv)
    assert args.command == "run" and str(args.config) == "/etc/sandgate/gateway.yaml"
    assert argv[0] == "/opt/sandgate/.venv/bin/sandgate"
    assert one("ExecReload") == "/bin/kill -HUP $MAINPID"
    assert one("Restart") == "on-failure"
    assert one("RestartPreventExitStatus") == "2"  # sandgate's exit code for a broken config


def test_stop_signals_the_main_process_alone() -> None:
    """The supervisor forwards SIGTERM to its workers once: systemd must not send it to them too."""
    assert one("KillSignal") == "SIGTERM"
    assert one("KillMode") == "mixed"


def test_the_unit_is_hardened_and_runs_as_its_own_user_with_net_admin_only() -> None:
    expected = {
        "User": "sandgate",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "CapabilityBoundingSet": "CAP_NET_ADMIN",
        "AmbientCapabilities": "CAP_NET_ADMIN",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "ProtectKernelTunables": "no",  # per-interface net sysctls; see the unit's comment
        "ProtectKernelModules": "yes",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
        "RestrictNamespaces": "yes",
        "RestrictSUIDSGID": "yes",
        "SystemCallArchitectures": "native",
        "UMask": "0077",
    }
    for key, value in expected.items():
        assert one(key) == value, key
    assert service()["SystemCallFilter"][0] == "@system-service"


def test_the_example_config_writes_only_where_the_unit_lets_it() -> None:
    config = load_config(DEPLOY / "systemd" / "gateway.yaml")
    writable = one("ReadWritePaths").split()
    assert f"/var/lib/{one('StateDirectory')}" in writable
    assert f"/var/log/{one('LogsDirectory')}" in writable
    for written in (config.state_path, config.audit_path, config.admin_socket_path, config.ca_dir):
        assert any(under(written, w) for w in writable), written
    assert config.placeholder_key_ref.startswith("file:/var/lib/sandgate/")
    # Every file: reference (placeholder key, store keys) is in the state folder, where the
    # gateway creates it on one machine and a fleet's copy goes; env: ones come from the
    # EnvironmentFile, which the shipped config does not need.
    refs = file_refs((DEPLOY / "systemd" / "gateway.yaml").read_text())
    assert {config.placeholder_key_ref, config.store_keys_ref} == {f"file:{r}" for r in refs}
    assert all(under(Path(r), f"/var/lib/{one('StateDirectory')}") for r in refs), refs
    assert env_refs((DEPLOY / "systemd" / "gateway.yaml").read_text()) == set()
    assert under(config.rules_path, "/etc/sandgate")
    assert {lst.mode for lst in config.listeners} == {"regular", "transparent"} and config.dns is not None
    # Ports below 1024 would need CAP_NET_BIND_SERVICE, which the unit does not grant.
    ports = [lst.port for lst in config.listeners] + [config.dns.port]
    assert min(ports) >= 1024


def test_a_fleet_gets_its_store_keys_from_add_key_as_readme_says(tmp_path: Path) -> None:
    """The example config in fleet mode (redis: set) refuses to invent store keys; the
    the manual's `sandgate credentials add-key` makes a 0600 keyring the gateway's loader takes,
    and a second run adds the newest key (rotation)."""
    text = (
        (DEPLOY / "systemd" / "gateway.yaml")
        .read_text()
        .replace("/var/lib/sandgate", str(tmp_path / "state"))
    )
    doc = yaml.safe_load(text)
    doc["redis"] = {"url": "redis://127.0.0.1:1/0"}  # add-key never connects
    doc["audit"]["path"] = str(tmp_path / "audit.jsonl")
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    fleet_keys = StoreKeys(config.store_keys_ref, create=config.redis is None)
    with pytest.raises(ConfigError, match="sandgate credentials add-key"):
        fleet_keys.keyring()
    for expected in (("k1",), ("k1", "k2")):
        run = subprocess.run(
            [SANDGATE, "credentials", "add-key", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        assert fleet_keys.keyring().ids == expected
    assert "copy the key file to every gateway" in run.stdout
    assert Path(config.store_keys_ref.removeprefix("file:")).stat().st_mode & 0o777 == 0o600


def _installed_copy(tmp_path: Path) -> Path:
    """The unit as installed from this checkout (its venv instead of /opt/sandgate/.venv)."""
    text = UNIT.read_text().replace("/opt/sandgate/.venv", str(VENV))
    path = tmp_path / "sandgate.service"
    path.write_text(text)
    return path


def test_systemd_analyze_verify_accepts_the_unit_without_a_warning(tmp_path: Path) -> None:
    result = subprocess.run(
        ["systemd-analyze", "verify", str(_installed_copy(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == "", "unknown keys and bad values are only warnings"


def test_systemd_rates_the_units_exposure_low(tmp_path: Path) -> None:
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(_installed_copy(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 3.0, result.stdout


def test_the_mdwe_launcher_really_refuses_writable_executable_memory(tmp_path: Path) -> None:
    launcher = tmp_path / "mdwe.py"
    launcher.write_text(MDWE_LAUNCHER)
    probe = "import mmap; mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)"
    under_mdwe = subprocess.run(
        [sys.executable, str(launcher), sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert under_mdwe.returncode != 0 and "PermissionError" in under_mdwe.stderr
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert plain.returncode == 0, plain.stderr


def test_the_gateway_serves_under_memory_deny_write_execute(tmp_path: Path) -> None:
    launcher = tmp_path / "mdwe.py"
    launcher.write_text(MDWE_LAUNCHER)
    log = tmp_path / "gateway.log"
    with RecordingUpstream(UPSTREAM_IP, name="mdwe-upstream") as upstream, log.open("wb") as out:
        tenants = {"t1.yaml": tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [upstream.port]}])}
        config_path, port = write_gateway_files(tmp_path, tenants)
        proc = subprocess.Popen(
            [sys.executable, str(launcher), SANDGATE, "run", "--config", str(config_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
        try:
            wait_for_port("127.0.0.1", port, timeout=30)
            proxy = f"http://sb1:test-token-0123456789abcdef@127.0.0.1:{port}"
            allowed = curl(
                "-o", "/dev/null", "-w", "%{http_code}", "-x", proxy, f"http://api.test:{upstream.port}/"
            )
            denied = curl("-o", "/dev/null", "-w", "%{http_code}", "-x", proxy, "http://other.test/")
            assert (allowed.stdout, denied.stdout) == ("200", "403"), log.read_text()
        finally:
            proc.terminate()
            proc.wait(15)
    assert "MemoryError" not in log.read_text() and "PermissionError" not in log.read_text()


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A folder another user can traverse (pytest's tmp folders are root-only)."""
    path = Path(tempfile.mkdtemp(prefix="sandgate-unit-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def netns_with_veth() -> Iterator[tuple[str, str]]:
    """A fresh network namespace holding a veth pair: (namespace, host-side interface)."""
    tag = secrets.token_hex(3)
    ns, host_if, peer = f"sgu{tag}", f"sguh{tag}", f"sgug{tag}"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
    try:
        subprocess.run(
            ["ip", "-n", ns, "link", "add", host_if, "type", "veth", "peer", "name", peer],
            check=True,
            timeout=30,
        )
        yield ns, host_if
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, timeout=30)


@pytest.mark.root
@pytest.mark.parametrize("ambient", [True, False], ids=["with ambient CAP_NET_ADMIN", "without capabilities"])
def test_the_units_user_registers_a_sandbox_with_net_admin_alone(
    world_readable_dir: Path, netns_with_veth: tuple[str, str], ambient: bool
) -> None:
    """What the unit grants (a non-root user, CAP_NET_ADMIN ambient) is enough for the
    registration path (nftables and the per-interface net sysctls), and nothing less is."""
    ns, interface = netns_with_veth
    root = world_readable_dir
    (root / "rules" / "tenants").mkdir(parents=True)
    (root / "rules" / "tenants" / "t1.yaml").write_text(
        yaml_text := tenant_yaml("t1", [{"hosts": ["api.test"]}])
    )
    assert yaml_text
    state = root / "state"
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY, NOBODY)
    config = root / "gateway.yaml"
    config.write_text(
        f"listeners: [{{mode: transparent, host: 0.0.0.0, port: 8081}}]\n"
        f"dns: {{host: 0.0.0.0, port: 8053}}\nrules_dir: {root / 'rules'}\nstate_dir: {state}\n"
    )
    # CAP_DAC_READ_SEARCH in both cases only because this machine's Python lives under /root
    # (0700); on a host the venv is in /opt/sandgate and the unit grants CAP_NET_ADMIN alone.
    wanted = "+net_admin,+dac_read_search" if ambient else "+dac_read_search"
    caps = ["--inh-caps", wanted, "--ambient-caps", wanted]
    result = subprocess.run(
        ["ip", "netns", "exec", ns, "setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
         *caps, SANDGATE, "sandbox", "add", "--config", str(config), "--interface", interface,
         "--address", "10.213.0.2", "--tenant", "t1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    table = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "list", "table", "inet", default_table(state)],
        capture_output=True,
        timeout=30,
    )
    if not ambient:
        assert result.returncode != 0 and table.returncode != 0
        assert "Permission denied" in result.stderr or "nft failed" in result.stderr, result.stderr
        assert not (state / "sandboxes.json").exists()
        return
    assert result.returncode == 0, result.stderr
    assert table.returncode == 0
    registry = state / "sandboxes.json"
    assert (registry.stat().st_uid, registry.stat().st_mode & 0o777) == (NOBODY, 0o600)
    rp_filter = subprocess.run(
        ["ip", "netns", "exec", ns, "cat", f"/proc/sys/net/ipv4/conf/{interface}/rp_filter"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert rp_filter.stdout.strip() == "1"
