"""Every method a request can mean is decided (sandgate.policy.overrides): one refusal refuses it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from sandgate.policy.decision import Decision, EgressRequest, Identity
from sandgate.policy.overrides import TooManyReadings, method_readings
from sandgate.policy.reasons import Reason

__all__ = ["decide_readings"]

Decide = Callable[..., Awaitable[Decision]]
_MAX_ECHO = 32  # a guest-chosen method name in a detail is cut to this


async def decide_readings(
    decide: Decide,
    identity: Identity | None,
    request: EgressRequest,
    decision: Decision,
    *,
    address: str | None,
) -> Decision:
    """`decision` (allowing `request`) once every other method the request can mean is
    decided too: the first refusal, else `decision`, or a reading's report-mode would-deny."""
    try:
        readings = method_readings(request.method or "", request.headers, request.query or "")
    except TooManyReadings as e:
        return Decision(
            reason=Reason.INVALID_REQUEST,
            policy_version=decision.policy_version,
            mode=decision.mode,
            detail=str(e),
        )
    for method, source in readings:
        other = await decide(identity, replace(request, method=method), address=address)
        where = f"read as {method[:_MAX_ECHO]!r} ({source})"
        if not other.allowed:
            return replace(other, detail=f"{where}: {other.detail}" if other.detail else where)
        if other.report_only and not decision.report_only:
            decision = replace(other, detail=where)
    return decision
