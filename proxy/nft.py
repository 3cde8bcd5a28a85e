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

__all__ = [
    "TABLE",
    "SandboxInterface",
    "apply_ruleset",
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


def set_interface_sysctls(interface: str) -> None:
    """Strict reverse-path filtering on a sandbox interface (defence in depth for anti-spoofing)."""
    path = Path("/proc/sys/net/ipv4/conf") / interface / "rp_filter"
    path.write_text("1\n")
    # A sandbox interface gets no IPv6 address, so the guest has no IPv6 path to the host either.
    v6 = Path("/proc/sys/net/ipv6/conf") / interface / "disable_ipv6"
    if v6.exists():
        v6.write_text("1\n")


def _nft(script: str) -> None:
    result = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"nft failed: {result.stderr.strip()}")
