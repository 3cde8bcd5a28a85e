"""`sandgate status [--wait [--timeout S]]`: whether the local gateway serves.

A gateway serves when its admin API answers `/readyz` with 200: the policy is loaded, every
listener (proxy, transparent, DNS) is bound and, with `redis:`, redis answers. The
deployments' readiness probes ask the same endpoint, so a script, compose and Kubernetes
agree on "ready". With the admin API off, the status file (written once every listener is
bound, trusted while its pid lives) answers instead.

The pid it names is the gateway's: the process that holds the state folder's lock
(proxy/state/state_lock.py), which a SIGTERM (`sandgate stop`) stops. With workers that is the
supervisor, not the lead worker that answers on the admin socket; the workers are listed
beside it. A lock held with nothing answering yet is a gateway that is starting.

Which gateway it asks is the one of the state folder its config names: `--config`'s
state_dir, else $SANDGATE_HOME, else ~/.sandgate. `--wait` says so once, on stderr, when it
starts waiting, and its time-out names the folder again (without `--config`, it suggests it):
a gateway started with `--config X` is not found without `--config X`.

Exit 0: it serves. 1: it does not (nothing answers, not ready yet, or not before
`--timeout`), with one line saying why. 2: usage or a broken config.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from sandgate.proxy.admin import client as admin_client
from sandgate.proxy.config import GatewayConfig, load_config
from sandgate.proxy.state.state_lock import holder, holder_text
from sandgate.proxy.state.statusfile import read_status

if TYPE_CHECKING:
    from sandgate.proxy.metrics import SinkFigures

__all__ = ["Readiness", "check", "run_status_command"]

EXIT_OK, EXIT_NOT_SERVING = 0, 1
POLL_SECONDS = 0.2
# One question to a gateway that hangs takes at most this long (and never past --timeout).
ANSWER_SECONDS = 5.0


@dataclass
class Readiness:
    """One look at the gateway: does it serve, who it is or why not, what it said about itself."""

    serving: bool
    reason: str
    status: dict[str, Any] = field(default_factory=dict)


def check(config: GatewayConfig, answer_within: float = ANSWER_SECONDS) -> Readiness:
    """Ask the gateway once."""
    pid = holder(config.state_path)
    if not config.admin.enabled:
        return _from_status_file(config, pid)
    sock = config.admin_socket_path
    try:
        ready = admin_client.readiness(config, timeout=answer_within)
        status = admin_client.status(config, timeout=answer_within)
    except admin_client.GatewayNotRunning:
        return Readiness(False, _not_answering(config, pid))
    except httpx.TimeoutException:
        return Readiness(False, f"the gateway on {sock} did not answer within {answer_within:g} s")
    except admin_client.AdminApiError as e:
        return Readiness(False, f"the gateway on {sock} answered: {e}")
    # The lead worker answers with its own pid; the gateway's is the lock holder's (the supervisor).
    status = {**status, "pid": pid or _status_file_pid(config) or status.get("pid", "?")}
    who = _who(status)
    if not ready.get("ready"):
        failing = [name for name, ok in ready.get("checks", {}).items() if not ok]
        return Readiness(False, f"{who} is not ready: {', '.join(failing) or 'not ready'}", status)
    return Readiness(True, who, status)


def _not_answering(config: GatewayConfig, pid: int | None) -> str:
    """Why nothing answers on the admin socket: no gateway, or one that is (re)starting."""
    sock = config.admin_socket_path
    if pid is None:
        return f"no gateway answers on {sock}"
    if read_status(config.status_path) is None:
        return f"gateway ({holder_text(pid)}) is starting: nothing answers on {sock} yet"
    return f"gateway ({holder_text(pid)}) runs, but nothing answers on {sock} now"


def _status_file_pid(config: GatewayConfig) -> int | None:
    status = read_status(config.status_path)
    return int(status["pid"]) if status is not None else None


def _who(status: dict[str, Any]) -> str:
    """The gateway and its pid, naming the supervisor as such when there are workers."""
    name = f"gateway {status['gateway_id']}" if "gateway_id" in status else "gateway"
    workers = _workers(status)
    if len(workers) > 1:
        return f"{name} (pid {status['pid']}, the supervisor of {len(workers)} workers)"
    return f"{name} (pid {status['pid']})"


def _workers(status: dict[str, Any]) -> list[tuple[int, Any, bool]]:
    """(index, pid, ready) of each worker: the lead's list (admin API) or the status file's pids."""
    listed = status.get("workers")
    if isinstance(listed, list):
        return [
            (int(w.get("index", i)), w.get("pid", "?"), w.get("ready") is True) for i, w in enumerate(listed)
        ]
    return [(i, pid, True) for i, pid in enumerate(status.get("worker_pids") or [])]


def _from_status_file(config: GatewayConfig, pid: int | None) -> Readiness:
    status = read_status(config.status_path)
    if status is None:
        if pid is not None:
            return Readiness(
                False, f"gateway ({holder_text(pid)}) is starting: {config.status_path} is not written yet"
            )
        return Readiness(False, f"no live gateway wrote {config.status_path} (the admin API is off)")
    return Readiness(True, f"{_who(status)}, from its status file (the admin API is off)", status)


def run_status_command(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    deadline = time.monotonic() + max(0.0, args.timeout)
    waiting = False
    try:
        result = check(config, ANSWER_SECONDS)
        while args.wait and not result.serving:
            if not waiting:
                # Said once, even when the first look took the whole wait (a loaded host).
                waiting = True
                where = _state_folder_text(config, args.config)
                print(
                    f"sandgate: waiting up to {args.timeout:g} s for the gateway on {where}", file=sys.stderr
                )
            left = deadline - time.monotonic()
            if left <= 0:
                result.reason = _timed_out(config, args.config, args.timeout, result.reason)
                break
            time.sleep(min(POLL_SECONDS, left))
            result = check(config, max(0.1, min(ANSWER_SECONDS, deadline - time.monotonic())))
    except KeyboardInterrupt:
        return 130
    _print(args.format, result, config.state_path, _audit_key(config), _sink_figures(config))
    return EXIT_OK if result.serving else EXIT_NOT_SERVING


def _state_folder_text(config: GatewayConfig, config_file: Path | None) -> str:
    """The state folder and what chose it: --config's state_dir, $SANDGATE_HOME or the default."""
    folder = f"state folder {config.state_path}"
    if "state_dir" in config.model_fields_set:
        return f"{folder} (the state_dir of --config {config_file})"
    # The same choice as GatewayConfig.state_dir's default (an empty $SANDGATE_HOME is unset).
    chosen = (
        "$SANDGATE_HOME"
        if os.environ.get("SANDGATE_HOME")
        else "the default ~/.sandgate, $SANDGATE_HOME unset"
    )
    if config_file is None:
        return f"{folder} (no --config: {chosen})"
    return f"{folder} (--config {config_file} sets no state_dir: {chosen})"


def _timed_out(config: GatewayConfig, config_file: Path | None, timeout: float, reason: str) -> str:
    """The time-out's one line: the folder waited on, why not, and without --config, a hint."""
    text = f"not serving after {timeout:g} s on state folder {config.state_path}: {reason}"
    if config_file is None:
        text += "; for a gateway started with --config FILE, run status with the same --config FILE"
    return text


def _audit_key(config: GatewayConfig) -> dict[str, str] | None:
    """The audit trail's signing key, public part (what a SIEM checks checkpoints with), if made."""
    # Lazy: cryptography's Ed25519 is loaded only by the status command that shows the key.
    from sandgate.proxy.audit.chain import key_id, load_public_key, public_key_path, public_pem

    path = public_key_path(config.ca_dir)
    try:
        key = load_public_key(path)
    except (OSError, ValueError):
        return None
    return {"key_id": key_id(key), "path": str(path), "pem": public_pem(key)}


def _sink_figures(config: GatewayConfig) -> list[SinkFigures]:
    """Each SIEM sink's figures, as its figures file says."""
    if not config.audit.sinks:
        return []
    # Lazy: the sinks' modules (prometheus_client, httpx clients), only for a gateway that has sinks.
    from sandgate.proxy.audit.sinks.figures import read_figures

    return read_figures(config)


def _print(
    fmt: str,
    result: Readiness,
    state_path: Path,
    audit_key: dict[str, str] | None = None,
    sinks: Sequence[SinkFigures] = (),
) -> None:
    if fmt == "json":
        doc = {"serving": result.serving, "reason": result.reason, "status": result.status}
        print(json.dumps({**doc, "audit_key": audit_key, "audit_sinks": [f._asdict() for f in sinks]}))
        return
    if not result.serving:
        print(f"sandgate: {result.reason}", file=sys.stderr)
        return
    st = result.status
    print(f"serving: {result.reason}")
    workers = _workers(st)
    if len(workers) > 1:
        named = (f"{i} pid {pid}" + ("" if ready else " (not ready)") for i, pid, ready in workers)
        print(f"workers: {', '.join(named)}")
    if "listeners" in st:
        print(f"listeners: {', '.join(st['listeners']) or '-'}")
    if "policy_version" in st and "tenants" in st:
        print(f"policy version {st['policy_version']}: {st['tenants']} tenants, {st['sandboxes']} sandboxes")
    if audit_key is not None:
        print(f"audit signing key: ed25519 {audit_key['key_id']}, exported to {audit_key['path']}")
        print(audit_key["pem"], end="")
    for f in sinks:  # as the sinks' figures files say (written about once a second)
        print(
            f"audit sink {f.name} ({f.kind}): {f.delivered} delivered, {f.queue_bytes} bytes queued, "
            f"oldest undelivered {f.oldest_seconds:.0f} s, {f.dropped_full + f.rejected} dropped"
        )
    print(f"state folder: {state_path}")
