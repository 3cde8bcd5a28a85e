"""What the supervisor does once before any worker starts: check addresses, make shared files.

Workers would each create the CA, the placeholder key and the store keys on a first start;
several processes creating one file at once race. The supervisor makes them first, so every
worker finds them. It checks every worker's addresses too (a port another process holds, even
through SO_REUSEPORT, refuses the start), since a worker cannot probe the explicit port its
peers already share.
"""

from __future__ import annotations

import socket
import subprocess
import sys

from sandgate.proxy.config import GatewayConfig, for_worker
from sandgate.proxy.errors import CAError, ConfigError, ListenerError
from sandgate.proxy.startup.bindcheck import Endpoint, endpoints, failure_line, probe
from sandgate.proxy.stores.placeholder_key import load_placeholder_key
from sandgate.proxy.stores.sealing_keys import StoreKeys
from sandgate.proxy.worker_role import WorkerRole

__all__ = ["check_all_endpoints", "check_worker_ports", "free_port", "make_shared_files"]

# Made in a short-lived child: sandgate.proxy.startup.ca loads mitmproxy's certs module, which the
# supervisor (a long-lived process that serves nothing) does not carry.
_MAKE_CA = (
    "import sys, pathlib; from sandgate.proxy.startup.ca import ensure_ca; "
    "ensure_ca(pathlib.Path(sys.argv[1]))"
)


def check_all_endpoints(config: GatewayConfig, count: int) -> None:
    """Raise ListenerError (one line) for the first address of any worker that cannot be bound,
    or that two listeners would share (worker i's transparent and DNS ports are base + i: a
    range may run into another listener's port)."""
    check_worker_ports(config, count)
    seen: dict[tuple[str, str, int], str] = {}
    for index in range(count):
        for endpoint in endpoints(for_worker(config, WorkerRole(index, count))):
            key = (endpoint.protocol, endpoint.host, endpoint.port)
            # Every worker shares the explicit listener (SO_REUSEPORT) and the admin listener
            # is the lead's: the same endpoint again is no clash; another one on its port is.
            name = f"{endpoint.what} {endpoint.address}"
            if key in seen:
                if seen[key] != name and endpoint.port:
                    raise ListenerError(
                        f"{name} (worker {index}) would share {endpoint.protocol} port "
                        f"{endpoint.port} with the {seen[key]}: worker i of {count} listens on the "
                        "transparent and DNS base ports + i; move the base ports apart"
                    )
                continue
            seen[key] = name
            _check(endpoint)


def check_worker_ports(config: GatewayConfig, count: int) -> None:
    """Transparent and DNS listeners need fixed base ports with workers: the host rules send
    each sandbox to worker i's port, which "any free port" would not tell them."""
    named = [("dns.port", config.dns.port)] if config.dns is not None else []
    named += [
        ("the transparent listener's port", lst.port) for lst in config.listeners if lst.mode == "transparent"
    ]
    for what, port in named:
        if port == 0:
            raise ConfigError(
                f"{what} is 0 (any free port): with {count} workers it must be fixed "
                "(worker i listens on it + i), or run with --workers 1"
            )


def _check(endpoint: Endpoint) -> None:
    error = probe(endpoint)
    if error is not None:
        raise ListenerError(failure_line(endpoint, error))


def free_port(host: str) -> int:
    """A TCP port free on `host` now, for an explicit listener configured as port 0 (any):
    the workers must all bind the same one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind(("" if host == "*" else host, 0))
        return int(sock.getsockname()[1])


def make_shared_files(config: GatewayConfig) -> None:
    """The CA, the placeholder key and (one machine) the store keys, created when missing."""
    config.state_path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not (config.ca_dir / "mitmproxy-ca.pem").exists():
        done = subprocess.run(
            [sys.executable, "-c", _MAKE_CA, str(config.ca_dir)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
            raise CAError(f"the CA could not be made in {config.ca_dir}: {lines[-1]}")
    load_placeholder_key(config.placeholder_key_ref)
    if config.redis is None:
        StoreKeys(config.store_keys_ref, create=True).keyring()
