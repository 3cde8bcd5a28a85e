"""Generate a sandgate rules directory with N tenants (10 allow rules and one sandbox each).

Tenant 0 is the benchmark's own tenant: its first rules name the loopback upstream
(`api.test` plain HTTP and intercepted HTTPS, `pass.api.test` passed-through HTTPS);
every other rule, of every tenant, names made-up hosts that nothing requests.
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BENCH_HOST",
    "PASS_HOST",
    "RULES_PER_TENANT",
    "BenchTenant",
    "tenant_hosts",
    "tenant_name",
    "write_rules_dir",
]

RULES_PER_TENANT = 10
BENCH_HOST = "api.test"
PASS_HOST = "pass.api.test"
_REPO_BASE = Path(__file__).resolve().parent.parent / "rules" / "base.yaml"


@dataclass(frozen=True, slots=True)
class BenchTenant:
    """The tenant and sandbox the benchmark client authenticates as."""

    tenant: str
    sandbox: str
    token: str


def tenant_name(i: int) -> str:
    return f"t{i:05d}"


def tenant_hosts(i: int) -> tuple[list[str], list[str]]:
    """(exact hosts on port 443, wildcard suffixes on 443/8443) of tenant i's filler rules.

    Every tenant has 7 exact-host rules; tenant 0 has its 3 benchmark rules where the others
    have 3 wildcard rules, so each tenant has exactly RULES_PER_TENANT rules.
    """
    name = tenant_name(i)
    exact = [f"h{j}.{name}.example.com" for j in range(7)]
    wild = [] if i == 0 else [f"w{j}.{name}.example.net" for j in range(3)]
    return exact, wild


def _rule(rule_id: str, host: str, ports: list[int], inspect: bool | None = None) -> str:
    text = f"  - id: {rule_id}\n    hosts: [{host!r}]\n    ports: [{', '.join(map(str, ports))}]\n"
    if inspect is not None:
        text += f"    inspect: {'true' if inspect else 'false'}\n"
    return text


def _tenant_yaml(i: int, token_digest: str, bench_ports: tuple[int, int] | None) -> str:
    name = tenant_name(i)
    rules: list[str] = []
    if bench_ports is not None:
        http_port, tls_port = bench_ports
        rules.append(_rule("plain", BENCH_HOST, [http_port]))
        rules.append(_rule("inspect", BENCH_HOST, [tls_port], inspect=True))
        rules.append(_rule("pass", PASS_HOST, [tls_port], inspect=False))
    exact, wild = tenant_hosts(i)
    for j, host in enumerate(exact):
        rules.append(_rule(f"e{j}", host, [443]))
    for j, suffix in enumerate(wild):
        rules.append(_rule(f"w{j}", f"*.{suffix}", [443, 8443]))
    assert len(rules) == RULES_PER_TENANT
    return (
        f"tenant: {name}\nmode: enforce\nsandboxes:\n  - id: {name}-sb\n"
        f"    token: sha256:{token_digest}\nallow:\n{''.join(rules)}"
    )


def write_rules_dir(root: Path, tenants: int, *, http_port: int = 80, tls_port: int = 443) -> BenchTenant:
    """Write `root/{base.yaml,tenants/*.yaml}`; return the benchmark tenant's credentials."""
    (root / "tenants").mkdir(parents=True, exist_ok=True)
    if _REPO_BASE.is_file():
        shutil.copyfile(_REPO_BASE, root / "base.yaml")
    token = secrets.token_urlsafe(24)
    for i in range(tenants):
        tok = token if i == 0 else f"unused-token-{i:05d}-{secrets.token_hex(8)}"
        digest = hashlib.sha256(tok.encode()).hexdigest()
        text = _tenant_yaml(i, digest, (http_port, tls_port) if i == 0 else None)
        (root / "tenants" / f"{tenant_name(i)}.yaml").write_text(text)
    return BenchTenant(tenant_name(0), f"{tenant_name(0)}-sb", token)
