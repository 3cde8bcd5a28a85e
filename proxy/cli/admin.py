"""CLI commands that act on the running gateway through its admin API.

`sandgate policy reload|status`. (`sandgate credentials set|rotate|remove|list` reach the
API through admin_client.ApiCredentialStore; `sandgate sandbox` through admin_client.)
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from sandgate.proxy.admin import client as admin_client
from sandgate.proxy.cli import policy_reload
from sandgate.proxy.config import load_config
from sandgate.proxy.sandboxes.sandbox_listing import sandboxes_text
from sandgate.proxy.state.state_lock import holder

__all__ = [
    "POLICY_COMMANDS",
    "run_policy_command",
]

POLICY_COMMANDS = ("reload", "status")
# `policy status` lists this many sandboxes; `sandbox list` lists them all.
STATUS_SANDBOXES = 20


def run_policy_command(args: argparse.Namespace) -> int:
    """Through the local gateway's admin API when it answers (a reload there also reaches the
    fleet); otherwise a fleet publish or fleet status with `redis:`, or SIGHUP to the gateway."""
    if args.policy_command == "reload":
        return policy_reload.reload_command(args.config, args.format)
    config = load_config(args.config)
    running = admin_client.gateway_running(config)
    if config.redis is not None or not running:
        return policy_reload.status_command(args.config, args.format)
    st = admin_client.status(config)
    # The lead worker answers with its own pid; the gateway's is the one `sandgate stop`
    # signals, the state folder's lock holder (the supervisor with workers).
    st = {**st, "pid": holder(config.state_path) or st["pid"]}
    workers = len(st.get("workers") or st.get("worker_pids") or [])
    supervisor = f", the supervisor of {workers} workers" if workers > 1 else ""
    last = st.get("last_reload")
    readiness = "ready" if st["ready"] else "NOT ready"
    lines = [
        f"gateway {st['gateway_id']} (pid {st['pid']}{supervisor}), {readiness}",
        f"policy version {st['policy_version']}: {st['tenants']} tenants, {st['sandboxes']} sandboxes",
        f"tenants: {', '.join(st.get('tenant_names', [])) or '-'}",
        f"listeners: {', '.join(st['listeners']) or '-'}",
        f"reload failures: {st['reload_failures']}; audit queue: {st['audit_queue_depth']}",
    ]
    for problem in st.get("policy_problems", []):
        lines.append(policy_reload.problem_line(problem))
        lines.extend(f"  {e}" for e in problem["errors"])
    lines.extend(f"note: {n}" for n in st.get("policy_notices", []))
    rows = list(st.get("sandbox_list", []))
    lines.append(sandboxes_text(rows[:STATUS_SANDBOXES]))
    if len(rows) > STATUS_SANDBOXES:
        lines.append(f"… and {len(rows) - STATUS_SANDBOXES} more: `sandgate sandbox list`")
    if last is not None:
        when = datetime.fromtimestamp(last["time"], UTC).isoformat(timespec="seconds")
        lines.append(f"last reload: {'ok' if last['ok'] else 'FAILED'} ({last['trigger']}, {when})")
        lines.extend(f"  {e}" for e in last["errors"])
    _emit(args.format, st, "\n".join(lines))
    return 0


def _emit(fmt: str, value: dict[str, Any], text: str) -> None:
    print(json.dumps(value, indent=2) if fmt == "json" else text)
