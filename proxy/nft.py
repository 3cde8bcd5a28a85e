"""Host plumbing for sandbox interfaces: one nftables table owned by sandgate, regenerated whole.

For each registered sandbox interface (and its one source address):
- anti-spoofing: a packet from the interface whose source is not the sandbox's address is
  dropped, and a sandbox's address arriving on any other interface is dropped too;
- IPv6 from a sandbox interface is dropped (never leaked), as is all UDP but DNS (QUIC
  included, so clients fall back to TCP);
- TCP is redirected to the transparent listener, UDP and TCP port 53 to the DNS listener;
- nothing from a sandbox interface reaches any other local port or is forwarded.
The whole table is replaced in one nft transaction, so add and remove are idempotent and
never leave a half-applied ruleset. rp_filter=1 on each interface is defence in depth.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

__all__ = [
    "TABLE",
    "SandboxInterface",
    "apply_ruleset",
    "ensure_sysctl",
    "remove_ruleset",
    "render_ruleset",
    "set_interface_sysctls",
]

TABLE = "sandgate"


@dataclass(frozen=True, slots=True)
class SandboxInterface:
    """A host-side interface that carries exactly one sandbox, with its source address."""

    interface: str
    address: str


def render_ruleset(
    sandboxes: Iterable[SandboxInterface], transparent_port: int, dns_port: int, table: str = TABLE
) -> str:
    """The complete `inet <table>` table for these interfaces."""
    items = sorted(set(sandboxes), key=lambda s: s.interface)
    if not items:
        return ""
    ifaces = ", ".join(f'"{s.interface}"' for s in items)
    sources = ", ".join(f'"{s.interface}" . {s.address}' for s in items)
    addrs = ", ".join(s.address for s in items)
    return f"""table inet {table} {{
  set ifaces {{ type ifname; elements = {{ {ifaces} }} }}
  set sources {{ type ifname . ipv4_addr; elements = {{ {sources} }} }}
  set addrs {{ type ipv4_addr; elements = {{ {addrs} }} }}
  chain sg_guard {{
    type filter hook prerouting priority raw; policy accept;
    iifname @ifaces iifname . ip saddr != @sources drop
    ip saddr @addrs iifname . ip saddr != @sources drop
    iifname @ifaces meta nfproto ipv6 drop
    iifname @ifaces meta l4proto != {{ tcp, udp }} drop
    iifname @ifaces meta l4proto udp udp dport != 53 drop
  }}
  chain sg_nat {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname @ifaces meta l4proto {{ tcp, udp }} th dport 53 redirect to :{dns_port}
    iifname @ifaces meta l4proto tcp redirect to :{transparent_port}
  }}
  chain sg_input {{
    type filter hook input priority filter; policy accept;
    iifname @ifaces tcp dport {{ {transparent_port}, {dns_port} }} accept
    iifname @ifaces udp dport {dns_port} accept
    iifname @ifaces drop
  }}
  chain sg_forward {{
    type filter hook forward priority filter; policy accept;
    iifname @ifaces drop
    oifname @ifaces drop
  }}
}}
"""


def apply_ruleset(
    sandboxes: Iterable[SandboxInterface], transparent_port: int, dns_port: int, table: str = TABLE
) -> None:
    """Replace sandgate's table in one transaction (or remove it when there is nothing to guard)."""
    body = render_ruleset(sandboxes, transparent_port, dns_port, table)
    if not body:
        remove_ruleset(table)
        return
    # "add" makes "delete" safe when the table does not exist yet; all three are one transaction.
    _nft(f"add table inet {table}\ndelete table inet {table}\n{body}")


def remove_ruleset(table: str = TABLE) -> None:
    """Remove sandgate's table, if present."""
    _nft(f"add table inet {table}\ndelete table inet {table}\n")


SYSCTL_NET = Path("/proc/sys/net")


def set_interface_sysctls(interface: str) -> None:
    """Strict reverse-path filtering on a sandbox interface (defence in depth for anti-spoofing),
    and no IPv6 on it. A value that already holds is not written again: containers mount
    /proc/sys read-only, and a host that set `all` to the same value needs no per-interface write."""
    ensure_sysctl(interface, "ipv4", "rp_filter")
    # A sandbox interface gets no IPv6 address, so the guest has no IPv6 path to the host either.
    if (SYSCTL_NET / "ipv6" / "conf" / interface).exists():
        ensure_sysctl(interface, "ipv6", "disable_ipv6")


def ensure_sysctl(interface: str, family: str, name: str, root: Path | None = None) -> None:
    """Make net.<family>.conf.<interface>.<name> effectively 1, or raise ConfigError saying how."""
    conf = (root or SYSCTL_NET) / family / "conf"
    path = conf / interface / name
    if _read_sysctl(path) == "1":
        return
    try:
        path.write_text("1\n")
        return
    except OSError as e:
        problem = e.strerror or str(e)
    # rp_filter takes the larger of `all` and the interface's value, so a host-wide strict
    # setting holds; disable_ipv6 is read per interface only (no fallback).
    if name == "rp_filter" and _read_sysctl(conf / "all" / name) == "1" and _read_sysctl(path) in {"0", "1"}:
        return
    raise ConfigError(
        f"cannot set net.{family}.conf.{interface}.{name}=1 ({problem}); set "
        f"net.{family}.conf.all.{name}=1 on the host, or give sandgate a writable /proc/sys"
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
