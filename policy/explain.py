"""Why a request is allowed or denied: the trace `decide` records of each step and what matched.

The steps are `decide`'s own (policy/trace.py), recorded as it decides, so an explanation never
disagrees with the gateway and the evaluation order is written once. Steps after the one
that decided are shown as not reached.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import decide
from sandgate.policy.decision import Decision, EgressRequest, Identity
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.overrides import decide_readings
from sandgate.policy.rego.protocol import PolicyEngine
from sandgate.policy.resolver import Resolver
from sandgate.policy.trace import AddressCheck, Outcome, RegoTrace, Step, StepName, Trace

__all__ = ["AddressCheck", "Explanation", "Outcome", "Step", "StepName", "explain"]


@dataclass(frozen=True, slots=True)
class Explanation:
    """The decision, every step of the order (taken or not reached), and Rego's part if any."""

    decision: Decision
    steps: tuple[Step, ...]
    rego: RegoTrace | None = None


async def explain(
    policy: PolicySet,
    identity: Identity | None,
    request: EgressRequest,
    resolver: Resolver,
    guard: AddressGuard,
    engine: PolicyEngine,
) -> Explanation:
    """Decide `request` with `decide`, recording each step of the order on the way.

    A request that can mean other methods (sandgate.policy.overrides) is decided for each of
    them as the gateway does; when one is refused, that reading is the one explained.
    """
    explained = await _explain_one(policy, identity, request, resolver, guard, engine)
    if not explained.decision.allowed:
        return explained
    refused: list[EgressRequest] = []

    async def decide_one(who: Identity | None, req: EgressRequest, *, address: str | None = None) -> Decision:
        found = await decide(policy, who, req, resolver, guard, address=address, engine=engine)
        if not found.allowed:
            refused.append(req)
        return found

    decision = await decide_readings(decide_one, identity, request, explained.decision)
    if decision is explained.decision:
        return explained
    if refused:
        explained = await _explain_one(policy, identity, refused[0], resolver, guard, engine)
    return replace(explained, decision=decision)


async def _explain_one(
    policy: PolicySet,
    identity: Identity | None,
    request: EgressRequest,
    resolver: Resolver,
    guard: AddressGuard,
    engine: PolicyEngine,
) -> Explanation:
    trace = Trace()
    decision = await decide(policy, identity, request, resolver, guard, engine=engine, trace=trace)
    return Explanation(decision, trace.padded(), trace.rego)
