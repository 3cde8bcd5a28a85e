"""What a gateway tells its operator once it serves: listeners, tenants, sandboxes and how
each is reached, the CA certificate, the audit trail, the admin socket.

Two renderings of one `Ready` value: the `gateway.ready` log event (fixed field names, lists
cut to `EVENT_ITEMS`, for machines) and a block of aligned lines on standard error (cut to
`BLOCK_ITEMS`, "and N more"), printed when the log format is `console` or standard error is
a terminal. A proxy token is never shown: only where it comes from (`<token from FILE>`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from sandgate.policy.model.policyset import SandboxRecord

__all__ = ["BLOCK_ITEMS", "EVENT_ITEMS", "Listener", "Ready", "block", "event_fields", "reach", "show_block"]

EVENT_ITEMS = 20
BLOCK_ITEMS = 5
_MODE_NAMES = {"regular": "proxy listener", "transparent": "transparent listener", "dns": "DNS listener"}


@dataclass(frozen=True, slots=True)
class Listener:
    """A bound listener: mode (regular, transparent, dns), address, port."""

    mode: str
    host: str
    port: int

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.mode}@{self.address}"


@dataclass(frozen=True, slots=True)
class Ready:
    """Everything the banner says, as plain values."""

    version: str
    pid: int
    policy_version: str
    listeners: Sequence[Listener]
    tenants: Sequence[str]
    sandboxes: Sequence[SandboxRecord]
    ca_cert: Path
    audit: Path
    admin: Sequence[str]  # "unix:/path" and, with admin.listen, "host:port"


def _shown_path(path: str) -> str:
    """A path relative to the working directory when it lies under it (shorter to read)."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _token_source(record: SandboxRecord) -> str:
    ref = record.token_ref
    if ref is None:
        return "<its registered token>"
    scheme, _, value = ref.partition(":")
    if scheme == "file":
        return f"<token from {_shown_path(value)}>"
    if scheme == "env":
        return f"<token from ${value}>"
    return f"<the token whose sha256 is {value[:12]}...>"


def reach(record: SandboxRecord, ready: Ready) -> str:
    """How this sandbox reaches the gateway, never with its token."""
    ways = []
    proxy = next((lst for lst in ready.listeners if lst.mode == "regular"), None)
    if record.token_digest is not None:
        if proxy is None:
            ways.append("proxy token, but no explicit proxy listener")
        else:
            ways.append(f"proxy http://{record.sandbox}:{_token_source(record)}@{proxy.address}")
    if record.addresses:
        on = f" on {record.interface}" if record.interface else ""
        ways.append(f"transparent from {', '.join(record.addresses)}{on}")
    return "; ".join(ways) or "no way in (neither a token nor an address)"


def event_fields(ready: Ready) -> dict[str, Any]:
    """The `gateway.ready` event's fields."""
    sandboxes = sorted(ready.sandboxes, key=lambda r: r.sandbox)
    return {
        "version": ready.version,
        "listeners": [str(lst) for lst in ready.listeners],
        "policy_version": ready.policy_version,
        "tenants": len(ready.tenants),
        "tenant_ids": sorted(ready.tenants)[:EVENT_ITEMS],
        "sandboxes": len(sandboxes),
        "sandbox_ids": [r.sandbox for r in sandboxes[:EVENT_ITEMS]],
        "ca_cert": str(ready.ca_cert),
        "audit": str(ready.audit),
        "admin": list(ready.admin),
    }


def _more(total: int, shown: int) -> str:
    return f"and {total - shown} more" if total > shown else ""


def block(ready: Ready) -> str:
    """The human-readable block (ends with a newline)."""
    rows: list[tuple[str, str]] = []
    for lst in ready.listeners:
        rows.append((_MODE_NAMES.get(lst.mode, f"{lst.mode} listener"), lst.address))
    tenants = sorted(ready.tenants)
    named = ", ".join(tenants[:BLOCK_ITEMS]) or "none"
    more = _more(len(tenants), BLOCK_ITEMS)
    rows.append((f"tenants ({len(tenants)})", f"{named}, {more}" if more else named))
    sandboxes = sorted(ready.sandboxes, key=lambda r: r.sandbox)
    rows.append((f"sandboxes ({len(sandboxes)})", "" if sandboxes else "none"))
    for record in sandboxes[:BLOCK_ITEMS]:
        rows.append(("", f"{record.sandbox} (tenant {record.tenant}): {reach(record, ready)}"))
    if len(sandboxes) > BLOCK_ITEMS:
        rows.append(("", f"{_more(len(sandboxes), BLOCK_ITEMS)} (sandgate sandbox list)"))
    rows.append(("CA certificate", str(ready.ca_cert)))
    rows.append(("audit trail", str(ready.audit)))
    for address in ready.admin:
        if address.startswith("unix:"):
            rows.append(("admin socket", address.removeprefix("unix:")))
        else:
            rows.append(("admin listener", address))
    width = max(len(label) for label, _ in rows)
    head = f"sandgate {ready.version} serves (pid {ready.pid}, policy version {ready.policy_version})"
    lines = [head, *(f"  {label:<{width}}  {text}".rstrip() for label, text in rows)]
    return "\n".join(lines) + "\n"


def show_block(log_format: str, stream: TextIO) -> bool:
    """The block is for people: on a console log, or when standard error is a terminal."""
    return log_format == "console" or stream.isatty()
