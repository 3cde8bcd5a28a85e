"""What a gateway tells its operator once it serves: listeners, tenants, sandboxes and how
each is reached, the CA certificate, the audit trail, the admin socket.

Two renderings of one `Ready` value: the `gateway.ready` log event (fixed field names, lists
cut to `EVENT_ITEMS`, for machines) and a block of aligned lines on standard error (cut to
`BLOCK_ITEMS`, "and N more"), printed when the log format is `console` or standard error is
a terminal. A proxy token is never shown: only where it comes from (`<token from FILE>`).

With workers the gateway prints one block, not one per worker: each worker logs its own
`gateway.ready`, the lead leaves the block's rows in its folder (`banner.json`), and the
supervisor prints them once every worker serves, under its own pid (the one to signal) and
with a row naming the workers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from sandgate.policy.model.policyset import SandboxRecord
from sandgate.proxy.config import GatewayConfig

__all__ = [
    "BANNER_FILE",
    "BLOCK_ITEMS",
    "EVENT_ITEMS",
    "Listener",
    "Ready",
    "announce",
    "block",
    "event_fields",
    "reach",
    "show_block",
    "supervisor_block",
]

EVENT_ITEMS = 20
BLOCK_ITEMS = 5
# The lead worker's block rows, in its folder, for the supervisor to print.
BANNER_FILE = "banner.json"
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
    # Worker processes of the gateway: worker i has transparent and DNS port base + i.
    workers: int = 1


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
    return _render(ready.version, ready.pid, ready.policy_version, _rows(ready))


def _listener_text(lst: Listener, workers: int) -> str:
    if workers > 1 and lst.port and lst.mode in ("transparent", "dns"):
        return f"{lst.address}-{lst.port + workers - 1} (worker i on {lst.port} + i)"
    return lst.address


def _rows(ready: Ready) -> list[tuple[str, str]]:
    """The block's (label, text) rows."""
    rows: list[tuple[str, str]] = []
    for lst in ready.listeners:
        rows.append((_MODE_NAMES.get(lst.mode, f"{lst.mode} listener"), _listener_text(lst, ready.workers)))
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
    return rows


def _render(version: str, pid: int, policy_version: str, rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(label) for label, _ in rows)
    head = f"sandgate {version} serves (pid {pid}, policy version {policy_version})"
    lines = [head, *(f"  {label:<{width}}  {text}".rstrip() for label, text in rows)]
    return "\n".join(lines) + "\n"


def show_block(log_format: str, stream: TextIO) -> bool:
    """The block is for people: on a console log, or when standard error is a terminal."""
    return log_format == "console" or stream.isatty()


def announce(ready: Ready, config: GatewayConfig, stream: TextIO) -> None:
    """Show the block once the gateway serves: a gateway of one process on `stream`; with
    workers, only the lead, and only into its folder for the supervisor (N blocks, each under
    a worker's pid, would name no pid that stops the gateway)."""
    role = config.worker
    if role.count > 1:
        if role.lead:
            _leave_rows(config.worker_dir / BANNER_FILE, replace(ready, workers=role.count))
        return
    if show_block(config.log.format, stream):
        stream.write("\n" + block(ready) + "\n")
        stream.flush()


def _leave_rows(path: Path, ready: Ready) -> None:
    """Write the block's rows for the supervisor (atomically: it may read at any moment)."""
    body = {"version": ready.version, "policy_version": ready.policy_version, "rows": _rows(ready)}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(body))
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)  # no block then; the gateway.ready events still say it all


def supervisor_block(path: Path, pid: int, worker_pids: Sequence[int]) -> str | None:
    """The gateway's block from the lead's rows, under the supervisor's `pid`, with a row naming
    the workers; None when the lead left none."""
    try:
        body = json.loads(path.read_text())
        rows = [(str(label), str(text)) for label, text in body["rows"]]
        version, policy_version = str(body["version"]), str(body["policy_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    named = ", ".join(str(p) for p in worker_pids)
    return _render(version, pid, policy_version, [("workers", f"{len(worker_pids)} (pids {named})"), *rows])
