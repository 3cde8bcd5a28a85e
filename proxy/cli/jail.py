"""`sandgate jail -- CMD`: run one command in a fresh network namespace behind the gateway.

The namespace gets a veth pair with unique names (several jails run at once), is registered
as a sandbox with host rules, resolves names through the gateway's DNS listener, trusts the
gateway CA, and can reach only what its tenant's policy allows. Everything is undone when the
command ends, fails or is interrupted (SIGINT, SIGTERM). It needs root.

One state folder, one gateway: a jail goes through the gateway that holds its state folder's
lock (proxy/state/state_lock.py), waiting for one that is starting, and starts a private gateway of
its own only when none holds it (which then holds it: a gateway started meanwhile on the same
folder refuses to start, and one that took the folder first is waited for instead).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from sandgate.policy.model.loader import load_policy_dir
from sandgate.proxy.admin.client import (
    AdminApiError,
    GatewayNotRunning,
    gateway_running,
    open_sandbox_listeners,
)
from sandgate.proxy.cli.credentials import placeholder_environment
from sandgate.proxy.config import DnsListenerConfig, GatewayConfig, ListenerConfig
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.net.host_addresses import own_addresses
from sandgate.proxy.sandboxes.registration import register, unregister
from sandgate.proxy.state.state_lock import holder, holder_text
from sandgate.proxy.state.statusfile import STATUS_FILE, read_status
from sandgate.proxy.stores.registry import DynamicSandbox, load_registry, registry_digest
from sandgate.proxy.worker_role import WorkerRole

__all__ = ["JAIL_NETWORK", "Jail", "run_jail"]

# Jails take /30s from here; addresses in it exist only inside jail namespaces.
JAIL_NETWORK = ipaddress.IPv4Network("10.213.0.0/16")
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
LOG_TAIL_LINES = 20
# How long a jail waits for a gateway that is starting on its state folder (several workers,
# each importing mitmproxy and loading the policy, can take tens of seconds on a loaded host).
GATEWAY_WAIT_SECONDS = 90.0
_WAIT_POLL_SECONDS = 0.1
CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO")


@dataclass
class Jail:
    """One jail's resources, so cleanup knows exactly what to undo."""

    config: GatewayConfig
    tenant: str
    sandbox: str
    suffix: str = field(default_factory=lambda: secrets.token_hex(3))
    netns: str = ""
    host_if: str = ""
    guest_if: str = ""
    host_addr: str = ""
    guest_addr: str = ""
    gateway: subprocess.Popen[bytes] | None = None
    tmpdir: Path | None = None
    registered: bool = False

    def __post_init__(self) -> None:
        self.netns = f"sgj-{self.suffix}"
        self.host_if = f"sgjh-{self.suffix}"
        self.guest_if = f"sgjg-{self.suffix}"

    # -- set up ------------------------------------------------------------------------------

    def setup(self) -> dict[str, str]:
        """Create everything; returns the environment for the command."""
        self.tmpdir = Path(tempfile.mkdtemp(prefix="sandgate-jail-"))
        status = self._gateway()
        self._network()
        register(
            self.config,
            DynamicSandbox(
                id=self.sandbox, tenant=self.tenant, interface=self.host_if, addresses=(self.guest_addr,)
            ),
        )
        self.registered = True
        self._wait_for_registry()
        return self._environment(Path(str(status["ca_cert"])))

    def _gateway(self) -> dict[str, object]:
        """The status of the gateway this jail goes through: the one that runs with this state_dir
        (asked to open a transparent and a DNS listener when it has none), or that is starting
        on it (waited for), else one of its own."""
        deadline = time.monotonic() + GATEWAY_WAIT_SECONDS
        waiting = False
        while True:
            status = self._running_gateway()
            if status is not None:
                return status
            pid = holder(self.config.state_path)
            if pid is None:
                status = self._start_gateway()
                if status is not None:
                    return status
                pid = holder(self.config.state_path) or 0  # it lost the folder to this one
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"the gateway ({holder_text(pid)}) on state_dir {self.config.state_path} did not "
                    f"come up within {GATEWAY_WAIT_SECONDS:g} s"
                )
            if not waiting:
                waiting = True
                print(
                    f"sandgate: waiting up to {GATEWAY_WAIT_SECONDS:g} s for the gateway "
                    f"({holder_text(pid)}) that is starting on state_dir {self.config.state_path}",
                    file=sys.stderr,
                    flush=True,
                )
            time.sleep(_WAIT_POLL_SECONDS)

    def _running_gateway(self) -> dict[str, object] | None:
        """The status of the gateway that serves on this state_dir, with listeners for jails
        (opened now when it has none); None while none serves (none runs, or one is starting)."""
        status = read_status(self.config.status_path)
        if status is None:
            return None  # with workers: until every one of them serves
        if status.get("transparent_port") and status.get("dns_port"):
            return status
        if gateway_running(self.config):
            return self._open_listeners()
        if self.config.admin.enabled and holder(self.config.state_path) is not None:
            return None  # its admin socket is not up yet (its lead worker restarting): wait
        raise ConfigError(
            f"a gateway (pid {status['pid']}) runs with state_dir {self.config.state_path} without "
            "transparent and DNS listeners, and nothing answers on its admin socket "
            f"({self.config.admin_socket_path}) to open them: enable its admin API, or give it "
            "a transparent listener and `dns:` in its config"
        )

    def _open_listeners(self) -> dict[str, object]:
        """Have the running gateway open the listeners a jail needs (kept until it exits)."""
        try:
            open_sandbox_listeners(self.config)
        except (AdminApiError, GatewayNotRunning) as e:
            raise ConfigError(f"the running gateway did not open listeners for jails: {e}") from None
        status = read_status(self.config.status_path)
        if not (status and status.get("transparent_port") and status.get("dns_port")):
            raise ConfigError(
                "the running gateway opened listeners for jails but its status does not show them"
            )
        return status

    def _start_gateway(self) -> dict[str, object] | None:
        """Start a gateway of its own with only what jails need, stopped when the jail ends; None
        when another gateway took the state folder first (it refused to start beside it)."""
        assert self.tmpdir is not None
        cfg = _absolute_paths(self.config)
        # Only what jails need: an explicit listener may already be taken by another gateway.
        cfg["listeners"] = [
            ListenerConfig(mode="transparent", host="0.0.0.0", port=_free_port()).model_dump()
        ]
        cfg["dns"] = DnsListenerConfig(host="0.0.0.0", port=_free_port(udp=True)).model_dump()
        # It fronts this one jail, which the host rules steer to one worker anyway: one worker
        # (and only the two ports found free are taken; worker i would take base + i).
        workers = cfg.get("workers")
        if isinstance(workers, dict):
            workers["count"] = 1
        config_file = self.tmpdir / "gateway.yaml"
        config_file.write_text(yaml.safe_dump(cfg))
        log_path = self.tmpdir / "gateway.log"
        with log_path.open("wb") as log:
            self.gateway = subprocess.Popen(
                [sys.executable, "-m", "sandgate.proxy.cli.main", "run", "--config", str(config_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "SANDGATE_WORKERS": "1"},
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = read_status(self.config.status_path)
            if status and status.get("pid") == self.gateway.pid:
                return status
            if self.gateway.poll() is not None:
                break
            time.sleep(0.05)
        self._stop_gateway()
        other = holder(self.config.state_path)
        if other is not None and other != self.gateway.pid:
            self.gateway = None
            return None
        # The log goes with the jail's temporary folder: its last lines go into the message.
        raise ConfigError(
            f"the jail's gateway did not start (exit code {self.gateway.returncode}); "
            f"the last lines of its log:\n{_tail(log_path, LOG_TAIL_LINES)}"
        )

    def _network(self) -> None:
        host_addr, guest_addr = _free_pair(self.config)
        self.host_addr, self.guest_addr = str(host_addr), str(guest_addr)
        _ip("netns", "add", self.netns)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.guest_if)
        _ip("link", "set", self.guest_if, "netns", self.netns)
        _ip("addr", "add", f"{self.host_addr}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("-n", self.netns, "addr", "add", f"{self.guest_addr}/30", "dev", self.guest_if)
        _ip("-n", self.netns, "link", "set", self.guest_if, "up")
        _ip("-n", self.netns, "link", "set", "lo", "up")
        _ip("-n", self.netns, "route", "add", "default", "via", self.host_addr)
        # `ip netns exec` bind-mounts /etc/netns/NAME/resolv.conf over /etc/resolv.conf.
        etc = Path("/etc/netns") / self.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text(f"nameserver {self.host_addr}\noptions timeout:2 attempts:2\n")

    def _wait_for_registry(self, timeout: float = 15.0) -> None:
        """Wait until the gateway has loaded the registry that names this sandbox: every worker
        of it (the jail's traffic goes to the one the host rules steer it to, which reloads on
        its own when the registry file changes)."""
        want = registry_digest(load_registry(self.config.registry_path))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(s and s.get("registry_digest") == want for s in self._worker_statuses()):
                return
            time.sleep(0.05)
        raise ConfigError("the gateway did not pick up the sandbox registration in time")

    def _worker_statuses(self) -> list[dict[str, object] | None]:
        """The gateway's status, or with workers each worker's own (in its folder)."""
        status = read_status(self.config.status_path)
        count = int(status.get("workers") or 1) if status else 1
        if count == 1:
            return [status]
        folders = [WorkerRole(i, count).folder(self.config.state_path) for i in range(count)]
        return [read_status(folder / STATUS_FILE) for folder in folders]

    def _environment(self, ca_cert: Path) -> dict[str, str]:
        assert self.tmpdir is not None
        bundle = self.tmpdir / "ca-bundle.pem"
        system = SYSTEM_CA_BUNDLE.read_text() if SYSTEM_CA_BUNDLE.exists() else ""
        bundle.write_text(system + "\n" + ca_cert.read_text())
        bundle.chmod(0o644)
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env.update({name: str(bundle) for name in CA_ENV})
        env["NODE_EXTRA_CA_CERTS"] = str(ca_cert)
        env["SANDGATE_SANDBOX"] = self.sandbox
        # The tenant's credentials, as placeholders: the real values never enter the jail.
        env.update(placeholder_environment(self.config, self.sandbox))
        return env

    # -- run and clean up --------------------------------------------------------------------

    def run(self, command: Sequence[str], env: dict[str, str]) -> int:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, *command], env=env, start_new_session=True
        )

        def forward(signum: int, _frame: FrameType | None) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signum)

        previous = {
            sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        }
        try:
            code = proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        return 128 - code if code < 0 else code

    def cleanup(self) -> None:
        """Undo everything this jail created; each step runs even if another fails."""
        steps = [
            self._kill_namespace_processes,
            self._unregister,
            self._delete_links,
            self._stop_gateway,
            self._remove_files,
        ]
        for step in steps:
            with contextlib.suppress(Exception):
                step()

    def _kill_namespace_processes(self) -> None:
        pids = subprocess.run(
            ["ip", "netns", "pids", self.netns], capture_output=True, text=True
        ).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)

    def _unregister(self) -> None:
        if self.registered:
            unregister(self.config, self.sandbox)

    def _delete_links(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        shutil.rmtree(Path("/etc/netns") / self.netns, ignore_errors=True)

    def _stop_gateway(self) -> None:
        if self.gateway is not None and self.gateway.poll() is None:
            self.gateway.terminate()
            try:
                self.gateway.wait(15)
            except subprocess.TimeoutExpired:
                self.gateway.kill()

    def _remove_files(self) -> None:
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP while the jail sets up: a KeyboardInterrupt, so no `except Exception` eats it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def run_jail(
    config: GatewayConfig, command: Sequence[str], *, tenant: str | None, sandbox: str | None
) -> int:
    """Run `command` jailed; returns its exit code (128+N when killed by signal N)."""
    if os.geteuid() != 0:
        raise ConfigError("sandgate jail needs root (network namespaces, veth, nftables): run it with sudo")
    if not command:
        raise ConfigError("nothing to run: sandgate jail [--tenant T] -- COMMAND [ARGS...]")
    tenants = sorted(load_policy_dir(config.rules_path).tenants)
    if tenant is None:
        if len(tenants) != 1:
            raise ConfigError(f"name a tenant with --tenant (one of: {', '.join(tenants) or 'none'})")
        tenant = tenants[0]
    elif tenant not in tenants:
        raise ConfigError(f"unknown tenant {tenant!r} (one of: {', '.join(tenants) or 'none'})")
    jail = Jail(config, tenant, sandbox or f"jail-{secrets.token_hex(3)}")

    def interrupted(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        env = jail.setup()
        return jail.run(command, env)
    except KeyboardInterrupt as stop:
        # A signal before the command ran (while setting up): 128+N for the signal that came,
        # as when it reaches the command; SIGINT arrives as Python's own KeyboardInterrupt.
        return 128 + (stop.signum if isinstance(stop, Interrupted) else signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        jail.cleanup()


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise ConfigError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def _tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a text file (or a note that there is none)."""
    try:
        text = path.read_text(errors="replace").rstrip("\n")
    except OSError as e:
        return f"(no log: {e.strerror})"
    return "\n".join(text.splitlines()[-lines:]) or "(the log is empty)"


def _absolute_paths(config: GatewayConfig) -> dict[str, object]:
    """The config as a dict whose paths stay right in a config file written elsewhere."""
    cfg: dict[str, Any] = config.model_dump(exclude={"base_dir"})
    for key in ("rules_dir", "state_dir"):
        cfg[key] = str(config.path(cfg[key]))
    for section, key in (
        ("audit", "path"),
        ("upstream", "trusted_ca"),
        ("admin", "socket"),
        ("rego", "bundle_store"),
    ):
        if cfg[section][key]:
            cfg[section][key] = str(config.path(cfg[section][key]))
    return cfg


def _free_port(*, udp: bool = False) -> int:
    """A port free where the jail's gateway binds it: on every address (a port bound on one
    address only, such as 127.0.0.2, refuses a bind on 0.0.0.0), for TCP and, with `udp`
    (the DNS listener), for UDP too."""
    for _ in range(64):
        with socket.socket() as tcp:
            tcp.bind(("0.0.0.0", 0))
            port = int(tcp.getsockname()[1])
            if not udp:
                return port
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as datagram:
                try:
                    datagram.bind(("0.0.0.0", port))
                except OSError:
                    continue
                return port
    raise OSError("no port is free for TCP and UDP on every address")


def _free_pair(config: GatewayConfig) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
    """A /30 in JAIL_NETWORK that no registered sandbox or local interface uses."""
    taken = {a for s in load_registry(config.registry_path) for a in s.addresses} | set(own_addresses())
    subnets = list(JAIL_NETWORK.subnets(new_prefix=30))
    start = secrets.randbelow(len(subnets))
    for i in range(len(subnets)):
        net = subnets[(start + i) % len(subnets)]
        hosts = list(net.hosts())
        if str(hosts[0]) not in taken and str(hosts[1]) not in taken:
            return hosts[0], hosts[1]
    raise ConfigError(f"no free /30 left in {JAIL_NETWORK}")
