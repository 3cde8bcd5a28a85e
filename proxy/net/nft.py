"""Host plumbing for sandbox interfaces: one nftables table owned by sandgate, regenerated whole.

For each registered sandbox interface (and its source addresses, IPv4 and IPv6):
- anti-spoofing: a packet from the interface whose source is not one of the sandbox's
  addresses is dropped, and a sandbox's address arriving on any other interface is dropped too;
- IPv6 from an interface without an IPv6 sandbox address is dropped (never leaked); on one with
  an IPv6 address only neighbour discovery passes besides the sandbox's own traffic;
- all UDP but DNS is dropped (QUIC included, so clients fall back to TCP);
- TCP is redirected to the transparent listener, UDP and TCP port 53 to the DNS listener;
  with several workers, to the listeners of the one worker the interface is steered to;
- nothing from a sandbox interface reaches any other local port or is forwarded.
The whole table is replaced in one nft transaction, so add and remove are idempotent and
never leave a half-applied ruleset: when nft refuses the new one, the old one stays in force.
rp_filter=1 on each interface is defence in depth (IPv4; IPv6 relies on the table alone).
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandgate.proxy.errors import ConfigError
from sandgate.proxy.worker_role import worker_for

__all__ = [
    "TABLE",
    "Ports",
    "SandboxInterface",
    "apply_ruleset",
    "enable_ipv6",
    "ensure_sysctl",
    "remove_ruleset",
    "render_ruleset",
    "set_interface_sysctls",
    "worker_ports",
]

TABLE = "sandgate"

# (transparent port, DNS port) of one worker; a list of them is indexed by worker.
Ports = tuple[int, int]


def worker_ports(transparent: int, dns: int, count: int) -> list[Ports]:
    """The ports of each of `count` workers: worker i owns base + i of both (WorkerRole.port)."""
    return [(transparent + i, dns + i) for i in range(count)]


@dataclass(frozen=True, slots=True)
class SandboxInterface:
    """A host-side interface that carries one sandbox, with its source addresses."""

    interface: str
    addresses: tuple[str, ...]


def _family(address: str) -> int:
    return ipaddress.ip_address(address).version


def _elements(items: Iterable[str]) -> str:
    listed = ", ".join(items)
    return f" elements = {{ {listed} }};" if listed else ""


def render_ruleset(
    sandboxes: Iterable[SandboxInterface],
    ports: Sequence[Ports],
    table: str = TABLE,
    *,
    comment: str = "",
) -> str:
    """The complete `inet <table>` table for these interfaces, steering each to the worker
    `worker_for(interface, len(ports))` whose (transparent, DNS) ports are `ports[worker]`."""
    if not ports:
        raise ValueError("no listener ports to redirect to")
    merged: dict[str, set[str]] = {}
    for s in sandboxes:
        merged.setdefault(s.interface, set()).update(s.addresses)
    if not merged:
        return ""
    pairs = sorted((iface, a) for iface, addrs in merged.items() for a in addrs)
    v4 = [(i, a) for i, a in pairs if _family(a) == 4]
    v6 = [(i, a) for i, a in pairs if _family(a) == 6]
    ifaces = _elements(f'"{i}"' for i in sorted(merged))
    ifaces6 = _elements(f'"{i}"' for i in sorted({i for i, _ in v6}))
    sources4 = _elements(f'"{i}" . {a}' for i, a in v4)
    sources6 = _elements(f'"{i}" . {a}' for i, a in v6)
    addrs4 = _elements(a for _, a in v4)
    addrs6 = _elements(a for _, a in v6)
    nd = "{ nd-neighbor-solicit, nd-neighbor-advert }"
    owner = f'  comment "{comment}"\n' if comment else ""
    maps, tcp_to, dns_to = _steering(sorted(merged), ports)
    # Every worker's ports: after the redirect, each guest's packets go to its own worker's.
    dns_ports = list(dict.fromkeys(str(d) for _, d in ports))
    tcp_ports = ", ".join(dict.fromkeys([*(str(t) for t, _ in ports), *dns_ports]))
    udp_ports = dns_ports[0] if len(dns_ports) == 1 else f"{{ {', '.join(dns_ports)} }}"
    return f"""table inet {table} {{
{owner}  set ifaces {{ type ifname;{ifaces} }}
  set ifaces6 {{ type ifname;{ifaces6} }}
  set sources4 {{ type ifname . ipv4_addr;{sources4} }}
  set sources6 {{ type ifname . ipv6_addr;{sources6} }}
  set addrs4 {{ type ipv4_addr;{addrs4} }}
  set addrs6 {{ type ipv6_addr;{addrs6} }}
  chain sg_guard {{
    type filter hook prerouting priority raw; policy accept;
    iifname @ifaces6 icmpv6 type {nd} ip6 hoplimit 255 accept
    iifname @ifaces meta nfproto ipv6 iifname != @ifaces6 drop
    iifname @ifaces meta nfproto ipv4 iifname . ip saddr != @sources4 drop
    iifname @ifaces meta nfproto ipv6 iifname . ip6 saddr != @sources6 drop
    ip saddr @addrs4 iifname . ip saddr != @sources4 drop
    ip6 saddr @addrs6 iifname . ip6 saddr != @sources6 drop
    iifname @ifaces meta l4proto != {{ tcp, udp }} drop
    iifname @ifaces meta l4proto udp udp dport != 53 drop
  }}
{maps}  chain sg_nat {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname @ifaces meta l4proto {{ tcp, udp }} th dport 53 redirect to :{dns_to}
    iifname @ifaces meta l4proto tcp redirect to :{tcp_to}
  }}
  chain sg_input {{
    type filter hook input priority filter; policy accept;
    iifname @ifaces6 icmpv6 type {nd} ip6 hoplimit 255 accept
    iifname @ifaces tcp dport {{ {tcp_ports} }} accept
    iifname @ifaces udp dport {udp_ports} accept
    iifname @ifaces drop
  }}
  chain sg_forward {{
    type filter hook forward priority filter; policy accept;
    iifname @ifaces drop
    oifname @ifaces drop
  }}
}}
"""


def _steering(interfaces: list[str], ports: Sequence[Ports]) -> tuple[str, str, str]:
    """The per-interface port maps (none with one worker) and the redirect targets.

    Steering is by interface, not by source address: a hash of the source address would send
    a dual-stack guest's IPv4 and IPv6 (its DNS over one family, its connections over the
    other) to different workers, whose name bindings are not shared. One interface carries
    one sandbox, so all of its addresses land on one worker."""
    if len(ports) == 1:
        return "", str(ports[0][0]), str(ports[0][1])
    worker = {i: ports[worker_for(i, len(ports))] for i in interfaces}
    tcp = _elements(f'"{i}" : {worker[i][0]}' for i in interfaces)
    dns = _elements(f'"{i}" : {worker[i][1]}' for i in interfaces)
    maps = (
        f"  map tcp_port {{ type ifname : inet_service;{tcp} }}\n"
        f"  map dns_port {{ type ifname : inet_service;{dns} }}\n"
    )
    return maps, " iifname map @tcp_port", " iifname map @dns_port"


def apply_ruleset(
    sandboxes: Iterable[SandboxInterface],
    ports: Sequence[Ports],
    table: str = TABLE,
    *,
    comment: str = "",
    drop_table: str | None = None,
) -> None:
    """Replace sandgate's table in one transaction (or remove it when there is nothing to guard);
    `drop_table` (an old table being replaced by this one) goes in the same transaction."""
    body = render_ruleset(sandboxes, ports, table, comment=comment)
    # "add" makes "delete" safe when the table does not exist yet; all of it is one transaction.
    old = f"add table inet {drop_table}\ndelete table inet {drop_table}\n" if drop_table else ""
    _nft(f"{old}add table inet {table}\ndelete table inet {table}\n{body}")


def remove_ruleset(table: str = TABLE) -> None:
    """Remove sandgate's table, if present."""
    _nft(f"add table inet {table}\ndelete table inet {table}\n")


SYSCTL_NET = Path("/proc/sys/net")


def set_interface_sysctls(interface: str, *, ipv6: bool = False) -> None:
    """Strict reverse-path filtering on a sandbox interface (defence in depth for anti-spoofing),
    and no IPv6 on it unless its sandbox has an IPv6 address. A value that already holds is not
    written again: containers mount /proc/sys read-only, and a host that set `all` to the same
    value needs no per-interface write."""
    ensure_sysctl(interface, "ipv4", "rp_filter")
    if not ipv6 and (SYSCTL_NET / "ipv6" / "conf" / interface).exists():
        # No IPv6 sandbox address: no IPv6 path to the host either.
        ensure_sysctl(interface, "ipv6", "disable_ipv6")


def enable_ipv6(interface: str) -> None:
    """IPv6 on an interface whose sandbox has an IPv6 address (called once its rules are in force):
    the guest's IPv6 reaches the listeners through it, and a 1 left by an earlier IPv4-only
    registration is undone. The operator gives the interface its host-side IPv6 address."""
    ensure_sysctl(interface, "ipv6", "disable_ipv6", value="0")


def ensure_sysctl(
    interface: str, family: str, name: str, root: Path | None = None, *, value: str = "1"
) -> None:
    """Make net.<family>.conf.<interface>.<name> effectively `value`, or raise ConfigError saying how."""
    conf = (root or SYSCTL_NET) / family / "conf"
    path = conf / interface / name
    if _read_sysctl(path) == value:
        return
    try:
        path.write_text(f"{value}\n")
        return
    except OSError as e:
        problem = e.strerror or str(e)
    # rp_filter takes the larger of `all` and the interface's value, so a host-wide strict
    # setting holds; disable_ipv6 is read per interface only (no fallback).
    if (
        name == "rp_filter"
        and value == "1"
        and _read_sysctl(conf / "all" / name) == "1"
        and _read_sysctl(path) in {"0", "1"}
    ):
        return
    raise ConfigError(
        f"cannot set net.{family}.conf.{interface}.{name}={value} ({problem}); set "
        f"net.{family}.conf.all.{name}={value} on the host, or give sandgate a writable /proc/sys"
    )


def _read_sysctl(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _nft(script: str) -> None:
    result = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"nft failed: {result.stderr.strip()}")
