"""Audit records: one canonical dict per decision, with fixed field names and no secrets."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl

from sandgate.policy.decision import Decision, Identity, Phase
from sandgate.proxy.metrics import METRICS

__all__ = [
    "DecisionContext",
    "decision_record",
    "format_time",
    "intent_record",
    "new_decision_id",
    "redact_query",
    "secret_scrubbed_record",
]

RECORD_VERSION = 1


def new_decision_id() -> str:
    """A unique id that sorts by time: milliseconds since the epoch, then 64 random bits."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(8).hex()}"


# The last second formatted (seconds since the epoch, its text to the second): every record of
# that second reuses it. One tuple, replaced whole: the writer thread and the loop both format.
_last_second: tuple[int, str] = (-1, "")


def format_time(epoch: float) -> str:
    """RFC 3339 UTC with milliseconds, as written to the audit trail (what
    `datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")` gives, with `Z`)."""
    global _last_second
    # Rounded to the microsecond as datetime.fromtimestamp rounds (half to even), then cut to ms.
    frac, whole = math.modf(epoch)
    seconds, micros = int(whole), round(frac * 1e6)
    if micros >= 1_000_000:
        seconds, micros = seconds + 1, micros - 1_000_000
    elif micros < 0:
        seconds, micros = seconds - 1, micros + 1_000_000
    cached_second, text = _last_second
    if cached_second != seconds:
        text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _last_second = (seconds, text)
    return f"{text}.{micros // 1000:03d}Z"


def redact_query(path: str) -> str:
    """The path with every query value replaced by `REDACTED` (keys are kept)."""
    base, sep, query = path.partition("?")
    if not sep:
        return base
    keys = [k for k, _ in parse_qsl(query, keep_blank_values=True)]
    return base + "?" + "&".join(f"{k}=REDACTED" for k in keys) if keys else base + "?REDACTED"


@dataclass(frozen=True, slots=True)
class DecisionContext:
    """What is known about the connection or request a decision is about. Frozen: a step that
    learns more (the request's path, the SNI) makes a new one with `dataclasses.replace`."""

    phase: Phase
    listener: str
    client: str
    host: str | None = None
    port: int | None = None
    sni: str | None = None
    method: str | None = None
    path: str | None = None
    identity: Identity | None = None
    decision_id: str = field(default_factory=new_decision_id)
    started: float = field(default_factory=time.monotonic)
    # Seconds the request was held for an approval (sandgate.proxy.approvals.holds), for its end record.
    waited: float | None = None


def decision_record(
    ctx: DecisionContext,
    decision: Decision,
    *,
    status: int | None = None,
    bytes_up: int | None = None,
    bytes_down: int | None = None,
    error: str | None = None,
    credentials: tuple[str, ...] = (),
    count: bool = True,
) -> dict[str, Any]:
    """The audit record of one decision (and its count in the metrics).

    `count=False` only for a start-up self-test's record, which no trail receives: a decision
    counted in the metrics always has its record.
    """
    tenant = ctx.identity.tenant if ctx.identity else None
    if count:
        METRICS.decision(tenant, decision.reason.value, ctx.phase.value, decision.verdict)
        METRICS.tenant_bytes(tenant, bytes_up, bytes_down)
    return _record(ctx, decision, status, bytes_up, bytes_down, error, credentials)


def intent_record(ctx: DecisionContext, decision: Decision) -> dict[str, Any]:
    """An allowed exchange's record as known before it goes upstream, for the intent journal:
    not counted in the metrics (its final record is, once)."""
    return _record(ctx, decision, None, None, None, None, ())


def _record(
    ctx: DecisionContext,
    decision: Decision,
    status: int | None,
    bytes_up: int | None,
    bytes_down: int | None,
    error: str | None,
    credentials: tuple[str, ...],
) -> dict[str, Any]:
    tenant = ctx.identity.tenant if ctx.identity else None
    record = {
        "event": "decision",
        "v": RECORD_VERSION,
        # Epoch seconds here; the audit writer thread renders it as RFC 3339 (off the hot path).
        "time": time.time(),
        "decision_id": ctx.decision_id,
        "tenant": tenant,
        "sandbox": ctx.identity.sandbox if ctx.identity else None,
        "phase": ctx.phase.value,
        "listener": ctx.listener,
        "client": ctx.client,
        "dest": {"host": ctx.host, "ip": decision.address, "port": ctx.port, "sni": ctx.sni},
        "method": ctx.method,
        "path": redact_query(ctx.path) if ctx.path is not None else None,
        "decision": decision.verdict,
        "reason": decision.reason.value,
        "rule_id": decision.rule_id,
        "policy_version": decision.policy_version,
        "mode": decision.mode.value,
        "credentials": list(credentials),
        "status": status,
        "bytes": {"up": bytes_up, "down": bytes_down},
        "duration_ms": round((time.monotonic() - ctx.started) * 1000, 3),
        "error": error,
        "detail": decision.detail or None,
    }
    if decision.approval is not None:
        # A request held for approval, as it ended (sandgate.proxy.approvals).
        approval: dict[str, Any] = {"id": decision.approval[0], "by": decision.approval[1]}
        if ctx.waited is not None:
            approval["waited_seconds"] = round(ctx.waited, 3)
        record["approval"] = approval
    if decision.refused:
        # The addresses the guard or a deny network refused, in the order they were checked.
        record["refused"] = [r.as_dict() for r in decision.refused]
    return record


def secret_scrubbed_record(dctx: DecisionContext, counts: dict[str, int], scope: str) -> dict[str, Any]:
    """The `secret_scrubbed` finding record: which credentials' real values came back in the
    exchange `dctx` decided (`scope`: its `response` or its `websocket` session), how often."""
    identity = dctx.identity
    return {
        "event": "finding",
        "v": RECORD_VERSION,
        "kind": "secret_scrubbed",
        "time": time.time(),
        "decision_id": new_decision_id(),
        "of": dctx.decision_id,
        "tenant": identity.tenant if identity else None,
        "sandbox": identity.sandbox if identity else None,
        "listener": dctx.listener,
        "client": dctx.client,
        "dest": {"host": dctx.host, "port": dctx.port},
        "method": dctx.method,
        "path": redact_query(dctx.path) if dctx.path is not None else None,
        "scope": scope,
        "credentials": sorted(counts),
        "count": sum(counts.values()),
        "counts": dict(sorted(counts.items())),
    }
