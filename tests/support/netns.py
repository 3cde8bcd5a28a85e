"""Real network namespaces for transparent-mode tests: guests, an upstream host, veth links.

Everything is created with unique names per test run and removed at teardown, with
addresses in 10.200.0.0/16 that exist only inside the namespaces created here. Servers are
started *inside* a namespace by binding from a thread that has entered it (setns affects
only the calling thread; threads it starts inherit the namespace).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Namespace", "NetnsLab", "in_namespace", "ip", "netns_lab"]


def ip(*args: str) -> None:
    """Run `ip ARGS`, raising with its error text on failure."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def in_namespace[T](name: str, fn: Callable[[], T]) -> T:
    """Call `fn` on a thread inside network namespace `name`; sockets it binds live there."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            with open(f"/var/run/netns/{name}") as f:
                os.setns(f.fileno(), os.CLONE_NEWNET)
            result.append(fn())
        except BaseException as e:
            error.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if error:
        raise error[0]
    return result[0]


@dataclass
class Namespace:
    """A namespace joined to the host by a veth pair: host side .1, namespace side .2 of a /30."""

    name: str
    host_if: str
    ns_if: str
    host_addr: str
    addr: str

    def exec(
        self, *cmd: str, timeout: float = 30, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace (its /etc/netns/NAME/resolv.conf applies)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *cmd], capture_output=True, text=True, timeout=timeout, env=env
        )

    def resolv_conf(self, nameserver: str) -> None:
        etc = Path("/etc/netns") / self.name
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text(f"nameserver {nameserver}\noptions timeout:1 attempts:1\n")


def free_subnet() -> int:
    """A random n in 100..199 whose 10.200.n.0/24 no host interface uses: a lab another run
    left behind (killed before its clean-up) must not share routes with a new one."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=False).stdout
    free = [n for n in range(100, 200) if f" 10.200.{n}." not in used]
    if not free:
        raise RuntimeError("every 10.200.100-199.0/24 is in use: leftover test namespaces?")
    return secrets.choice(free)


@dataclass
class NetnsLab:
    """Creates namespaces with unique names and removes all of them on close."""

    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    subnet: int = field(default_factory=lambda: free_subnet())
    namespaces: list[Namespace] = field(default_factory=list)

    def add(self, role: str) -> Namespace:
        """A new namespace `sgt-<role>-<tag>` on the next /30 of 10.200.<subnet>.0/24."""
        n = len(self.namespaces)
        base = 4 * n
        ns = Namespace(
            name=f"sgt-{role}-{self.tag}",
            host_if=f"sgh{n}-{self.tag}",
            ns_if=f"sgn{n}-{self.tag}",
            host_addr=f"10.200.{self.subnet}.{base + 1}",
            addr=f"10.200.{self.subnet}.{base + 2}",
        )
        self.namespaces.append(ns)
        ip("netns", "add", ns.name)
        ip("link", "add", ns.host_if, "type", "veth", "peer", "name", ns.ns_if)
        ip("link", "set", ns.ns_if, "netns", ns.name)
        ip("addr", "add", f"{ns.host_addr}/30", "dev", ns.host_if)
        ip("link", "set", ns.host_if, "up")
        ip("-n", ns.name, "addr", "add", f"{ns.addr}/30", "dev", ns.ns_if)
        ip("-n", ns.name, "link", "set", ns.ns_if, "up")
        ip("-n", ns.name, "link", "set", "lo", "up")
        ip("-n", ns.name, "route", "add", "default", "via", ns.host_addr)
        return ns

    def close(self) -> None:
        for ns in self.namespaces:
            with contextlib.suppress(Exception):
                pids = subprocess.run(
                    ["ip", "netns", "pids", ns.name], capture_output=True, text=True
                ).stdout.split()
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), 9)
            subprocess.run(["ip", "link", "del", ns.host_if], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns.name], capture_output=True)
            with contextlib.suppress(FileNotFoundError):
                for f in (Path("/etc/netns") / ns.name).iterdir():
                    f.unlink()
                (Path("/etc/netns") / ns.name).rmdir()


@contextlib.contextmanager
def netns_lab() -> Iterator[NetnsLab]:
    lab = NetnsLab()
    try:
        yield lab
    finally:
        lab.close()


def tcp_echo_server(host: str, port: int) -> Callable[[], None]:
    """A raw TCP server that greets first (like a database) and echoes; returns a stopper."""
    srv = socket.create_server((host, port))
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    conn.sendall(b"HELLO sandgate-db\n")
                    data = conn.recv(4096)
                    conn.sendall(b"ECHO " + data)

    t = threading.Thread(target=serve, daemon=True)
    t.start()

    def close() -> None:
        stop.set()
        srv.close()
        t.join(2)

    return close
