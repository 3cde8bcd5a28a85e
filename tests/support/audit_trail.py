"""The shared audit trail of the audit command tests: records as the gateway writes them.

Three rotated files' worth (`audit.jsonl.2` oldest … `audit.jsonl` newest) of decisions and
one policy reload, with readable ids (`r0` … `r12`) and times from BASE.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sandgate.policy.decision import Decision, Identity, Mode, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.audit.records import DecisionContext, decision_record, format_time

__all__ = ["BASE", "DECISIONS", "TRAIL", "at", "decision", "line", "reload_record"]

BASE = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def at(minutes: float) -> float:
    """Epoch seconds `minutes` after BASE."""
    return (BASE + timedelta(minutes=minutes)).timestamp()


def decision(
    name: str,
    when: float,
    reason: Reason,
    host: str,
    *,
    tenant: str | None = "t1",
    sandbox: str = "sb1",
    phase: Phase = Phase.REQUEST,
    port: int = 443,
    method: str | None = None,
    path: str | None = None,
    credentials: tuple[str, ...] = (),
    rule_id: str | None = None,
    report: bool = False,
) -> dict[str, Any]:
    """A decision record as the gateway writes it, with `name` as its decision_id."""
    ctx = DecisionContext(
        phase=phase,
        listener="regular@127.0.0.1:8080",
        client="127.0.0.1:40000",
        host=host,
        port=port,
        sni=host if phase is Phase.TLS else None,
        method=method,
        path=path,
        identity=Identity(tenant, sandbox) if tenant else None,
        decision_id=name,
    )
    allowed = reason is Reason.ALLOWED
    verdict = Decision(
        allowed=allowed or report,
        reason=reason,
        rule_id=rule_id,
        policy_version="a4c4c1347d42",
        mode=Mode.REPORT if report else Mode.ENFORCE,
        report_only=report,
        address="127.0.0.2" if allowed else None,
    )
    record = decision_record(
        ctx, verdict, credentials=credentials, status=200 if allowed and method else None
    )
    record["time"] = format_time(when)  # rendered as the audit writer thread does
    # Fixed, not measured: records of one length, so tests that rotate by size rotate where they say.
    record["duration_ms"] = 0.006
    return record


def reload_record(name: str, when: float) -> dict[str, Any]:
    """A policy_reload record as `proxy/refresh/reloader.py` writes it."""
    return {
        "event": "policy_reload",
        "v": 1,
        "time": format_time(when),
        "decision_id": name,
        "trigger": "sighup",
        "result": "ok",
        "old_version": "a4c4c1347d42",
        "policy_version": "b5d5d2458e53",
        "errors": [],
    }


def line(record: dict[str, Any]) -> str:
    """One record as the audit writer encodes it."""
    return json.dumps(record, separators=(",", ":")) + "\n"


R = Reason
TRAIL: dict[str, list[dict[str, Any]]] = {
    "audit.jsonl.2": [
        decision(
            "r0", at(0), R.ALLOWED, "api.test", method="GET", path="/v1/items?key=REDACTED",
            credentials=("github",), rule_id="t1/allow/api",
        ),
        decision("r1", at(5), R.HOST_NOT_ALLOWED, "evil.test", phase=Phase.CONNECT),
        decision(
            "r2", at(10), R.ALLOWED, "open.test", tenant="t2", sandbox="sb9", method="GET", path="/",
            rule_id="t2/allow/open",
        ),
    ],
    "audit.jsonl.1": [
        decision("r3", at(20), R.PATH_NOT_ALLOWED, "api.test", method="POST", path="/v1/users/1"),
        decision("r4", at(25), R.PATH_NOT_ALLOWED, "api.test", method="POST", path="/v1/users/2?x=REDACTED"),
        decision("r5", at(30), R.NO_IDENTITY, "api.test", tenant=None, phase=Phase.CONNECT),
        reload_record("r6", at(35)),
    ],
    "audit.jsonl": [
        decision("r7", at(40), R.HOST_NOT_ALLOWED, "evil.test", phase=Phase.TLS, port=8443),
        decision("r8", at(45), R.PRIVATE_ADDRESS, "meta.test", phase=Phase.CONNECT, port=80),
        decision(
            "r9", at(50), R.HOST_NOT_ALLOWED, "x.other.test", tenant="t2", sandbox="sb9",
            phase=Phase.CONNECT, report=True,
        ),
        decision(
            "r10", at(55), R.ALLOWED, "api.test", method="POST", path="/v1/items",
            credentials=("github", "openai"), rule_id="t1/allow/api",
        ),
        decision("r11", at(60), R.METHOD_NOT_ALLOWED, "api.test", method="DELETE", path="/v1/items/7"),
        decision("r12", at(65), R.PORT_NOT_ALLOWED, "once.test", phase=Phase.CONNECT, port=22),
    ],
}  # fmt: skip
DECISIONS = [r["decision_id"] for f in TRAIL.values() for r in f if r["event"] == "decision"]
