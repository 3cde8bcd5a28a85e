"""Why a request is allowed or denied: the trace `decide` records of each step and what matched.

The steps are `decide`'s own (policy/steps.py), recorded as it decides, so an explanation never
disagrees with the gateway and the evaluation order is written once. Steps after the one
that decided are shown as not reached. A DNS query is explained with the DNS listener's own
order (`decide_name`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import CredentialBindings, decide, decide_name
from sandgate.policy.decision import Decision, EgressRequest, Identity
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.overrides import Decide, decide_readings
from sandgate.policy.rego.protocol import PolicyEngine
from sandgate.policy.resolver import Resolver
from sandgate.policy.trace import DNS_ORDER, AddressCheck, Outcome, RegoTrace, Step, StepName, Trace

__all__ = ["AddressCheck", "Explanation", "Outcome", "Step", "StepName", "explain", "explain_name"]


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
    *,
    reserved: str | None = None,
    bindings: CredentialBindings | None = None,
) -> Explanation:
    """Decide `request` with `decide`, recording each step of the order on the way.

    `reserved` and `bindings` are the gateway's own name and its tenants' credentials, as
    the gateway passes them. A request that can mean other methods (sandgate.policy.overrides)
    is decided for each of them as the gateway does; when one is refused, that reading is the
    one explained.
    """

    async def decide_one(
        who: Identity | None, req: EgressRequest, *, address: str | None = None, trace: Trace | None = None
    ) -> Decision:
        return await decide(
            policy,
            who,
            req,
            resolver,
            guard,
            address=address,
            engine=engine,
            trace=trace,
            reserved=reserved,
            bindings=bindings,
        )

    explained = await _explain_one(decide_one, identity, request)
    if not explained.decision.allowed:
        return explained
    refused: list[EgressRequest] = []

    async def reading(who: Identity | None, req: EgressRequest, *, address: str | None = None) -> Decision:
        found = await decide_one(who, req, address=address)
        if not found.allowed:
            refused.append(req)
        return found

    decision = await decide_readings(reading, identity, request, explained.decision)
    if decision is explained.decision:
        return explained
    if refused:
        explained = await _explain_one(decide_one, identity, refused[0])
    return replace(explained, decision=decision)


async def _explain_one(decide_one: Decide, identity: Identity | None, request: EgressRequest) -> Explanation:
    trace = Trace()
    decision = await decide_one(identity, request, trace=trace)
    return Explanation(decision, trace.padded(), trace.rego)


async def explain_name(policy: PolicySet, identity: Identity | None, name: str) -> Explanation:
    """Decide a DNS query for the normalised `name` with `decide_name`, as the DNS listener does."""
    trace = Trace()
    decision = await decide_name(policy, identity, name, trace=trace)
    return Explanation(decision, trace.padded(DNS_ORDER))
