"""A listener that cannot be bound: one line naming it, its address and what to change, exit 1.

Every busy port here is a real socket the test binds on loopback; the gateway is the real
`sandgate run` (or, for a port taken between the check and the bind, a Gateway in process).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SANDGATE, tenant_yaml, write_gateway_files
from support import free_port, wait_for_port

from sandgate.proxy.config import load_config
from sandgate.proxy.runtime import Gateway

pytestmark = pytest.mark.slow


def busy(port: int, protocol: str = "tcp", host: str = "127.0.0.1") -> socket.socket:
    """A real socket holding `port` (listening, for TCP)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM if protocol == "tcp" else socket.SOCK_DGRAM)
    sock.bind((host, port))
    if protocol == "tcp":
        sock.listen()
    return sock


@pytest.fixture
def held() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def run(config_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, "run", "--config", str(config_path), *extra],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=config_path.parent,
    )


def one_line(stderr: str) -> str:
    """The failure must be the only thing said: one line, no mitmproxy or Python internals."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    for word in ("Errno", "Traceback", "mitmproxy", "failed to listen"):
        assert word not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize(
    ("listener", "protocol", "expected"),
    [
        (
            "proxy",
            "tcp",
            "sandgate: proxy listener 127.0.0.1:{port}: port {port} is in use: pass a free one with --port",
        ),
        (
            "transparent",
            "tcp",
            "sandgate: transparent listener 127.0.0.1:{port}: port {port} is in use: "
            "change its port under listeners: in the config",
        ),
        (
            "dns",
            "udp",
            "sandgate: DNS listener 127.0.0.1:{port} (udp): port {port} is in use: change dns.port in the config",
        ),
        (
            "dns",
            "tcp",
            "sandgate: DNS listener 127.0.0.1:{port} (tcp): port {port} is in use: change dns.port in the config",
        ),
        (
            "admin",
            "tcp",
            "sandgate: admin listener 127.0.0.1:{port}: port {port} is in use: "
            "change admin.listen in the config",
        ),
    ],
    ids=[
        "a busy proxy port says to pass a free one with --port",
        "a busy transparent port names the listener",
        "a busy DNS port over udp names the protocol",
        "a busy DNS port over tcp names the protocol",
        "a busy admin port names admin.listen",
    ],
)
def test_a_busy_port_is_one_line_and_exit_1(
    tmp_path: Path, held: list[socket.socket], listener: str, protocol: str, expected: str
) -> None:
    port = free_port()
    proxy_port = port if listener == "proxy" else free_port()
    config: dict[str, Any] = {}
    if listener == "transparent":
        config["listeners"] = [
            {"host": "127.0.0.1", "port": proxy_port},
            {"mode": "transparent", "host": "127.0.0.1", "port": port},
        ]
    elif listener == "dns":
        config["dns"] = {"host": "127.0.0.1", "port": port}
    elif listener == "admin":
        token = tmp_path / "admin.token"
        token.write_text("admin-token-0123456789abcdef")
        token.chmod(0o600)
        config["admin"] = {"listen": f"127.0.0.1:{port}", "token": f"file:{token}"}
    config_path, _ = write_gateway_files(
        tmp_path, {"t1.yaml": tenant_yaml("t1", [])}, config=config, port=proxy_port
    )
    held.append(busy(port, protocol))
    proc = run(config_path)
    assert proc.returncode == 1, proc.stderr
    assert one_line(proc.stderr) == expected.format(port=port)


def test_a_busy_port_given_with_port_asks_for_a_free_one(tmp_path: Path, held: list[socket.socket]) -> None:
    """`--port N` on a taken N: the line must not read as if --port had not been passed."""
    config_path, _ = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [])})
    port = free_port()
    held.append(busy(port, "tcp"))
    proc = run(config_path, "--port", str(port))
    assert proc.returncode == 1, proc.stderr
    assert one_line(proc.stderr) == (
        f"sandgate: proxy listener 127.0.0.1:{port}: port {port} is in use: pass a free one with --port"
    )


@pytest.mark.parametrize("listener", ["proxy", "dns"], ids=["the proxy port", "the DNS port"])
async def test_a_port_taken_after_the_check_ends_in_the_same_line(
    tmp_path: Path, held: list[socket.socket], capfd: pytest.CaptureFixture[str], listener: str
) -> None:
    """The bind itself fails (the check was passed): the gateway stops with exit code 1 and the
    same one line, and mitmproxy's own `[Errno 98]` line is not printed."""
    port = free_port()
    config: dict[str, Any] = {"log": {"format": "console"}}
    if listener == "dns":
        config["dns"] = {"host": "127.0.0.1", "port": port}
    config_path, proxy_port = write_gateway_files(
        tmp_path,
        {"t1.yaml": tenant_yaml("t1", [])},
        config=config,
        port=port if listener == "proxy" else None,
    )
    gateway = Gateway(load_config(config_path))
    held.append(busy(port, "udp" if listener == "dns" else "tcp"))
    code = await asyncio.wait_for(gateway.run(signals=False), 60)
    assert code == 1
    where = (
        f"proxy listener 127.0.0.1:{port}" if listener == "proxy" else f"DNS listener 127.0.0.1:{port} (udp)"
    )
    assert gateway.start_failure is not None and gateway.start_failure.startswith(
        f"{where}: port {port} is in use"
    )
    err = capfd.readouterr().err
    assert "Errno" not in err and "failed to listen" not in err, err
    # Its other listeners were given back.
    if listener == "dns":
        with socket.create_server(("127.0.0.1", proxy_port)):
            pass


def test_run_port_moves_the_explicit_listener(tmp_path: Path) -> None:
    config_path, config_port = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [])})
    port = free_port()
    proc = subprocess.Popen(
        [SANDGATE, "run", "--config", str(config_path), "--port", str(port)], stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port("127.0.0.1", port, timeout=60)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", config_port), timeout=2).close()
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


@pytest.mark.parametrize(
    ("listeners", "found"),
    [
        ([{"host": "127.0.0.1", "port": 1}, {"host": "127.0.0.2", "port": 2}], "has 2"),
        ([{"mode": "transparent", "host": "127.0.0.1", "port": 3}], "has none"),
    ],
    ids=[
        "two explicit listeners make --port ambiguous",
        "no explicit listener leaves --port nothing to move",
    ],
)
def test_run_port_needs_exactly_one_explicit_listener(
    tmp_path: Path, listeners: list[dict[str, Any]], found: str
) -> None:
    config_path, _ = write_gateway_files(
        tmp_path, {"t1.yaml": tenant_yaml("t1", [])}, config={"listeners": listeners}
    )
    proc = run(config_path, "--port", str(free_port()))
    assert proc.returncode == 2
    assert one_line(proc.stderr) == (
        f"sandgate: --port sets the port of the one explicit proxy listener (mode: regular); {config_path} "
        f"{found}: set the ports under listeners: instead"
    )


class _TerminateAsListenersOpen:
    """Runs first in the `running` hook: SIGTERM's handler, then waits for its drain to close them."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def running(self) -> None:
        self.gateway.terminate()
        servers = self.gateway.master.addons.get("proxyserver").servers
        async with asyncio.timeout(20):
            while any(s.is_running for s in servers):
                await asyncio.sleep(0.01)


async def test_a_sigterm_while_the_listeners_open_is_a_clean_stop(tmp_path: Path) -> None:
    # The drain closes listeners the start-up check would otherwise take for ones that failed.
    config_path, _ = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [])})
    gateway = Gateway(load_config(config_path))
    chain = gateway.master.addons.chain
    gateway.master.addons.add(_TerminateAsListenersOpen(gateway))
    chain.insert(0, chain.pop())
    code = await asyncio.wait_for(gateway.run(signals=False), 60)
    assert (code, gateway.start_failure) == (0, None)
    assert not gateway.ready.is_set()
