"""One request on its way through the evaluation order: what is asked, and what each step found.

The steps (sandgate.policy.steps) read and write one `Evaluation`; the trace of a step
(sandgate.policy.steps_trace) is rendered from it, so a step never records anything itself.
"""

from __future__ import annotations

from dataclasses import replace
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from sandgate.policy.address_choice import parse_ip
from sandgate.policy.address_guard import IPAddress
from sandgate.policy.decision import Decision, EgressRequest, Identity, Mode, Refusal
from sandgate.policy.reasons import Reason

if TYPE_CHECKING:
    from sandgate.policy.address_choice import AddressChoice
    from sandgate.policy.address_guard import AddressGuard
    from sandgate.policy.matcher import CompiledRule, RuleMatch
    from sandgate.policy.model.grants import Grant, Grants
    from sandgate.policy.model.policyset import PolicySet, TenantPolicy
    from sandgate.policy.rego.protocol import PolicyEngine, RegoVerdict
    from sandgate.policy.resolver import Resolver

__all__ = ["CredentialBindings", "Evaluation", "RulesOutcome"]


class CredentialBindings(Protocol):
    """Which of a tenant's credentials are bound to a destination (the credential broker)."""

    def bound_names(self, tenant: str, host: str, port: int) -> tuple[str, ...]:
        """The names of the tenant's credentials bound to host:port, in declaration order."""
        ...


class RulesOutcome(Enum):
    """What the tenant's rules (steps 3 and 4) came to, for the steps after them.

    A denial report mode does not relax ends the evaluation at once: it has no member.
    """

    ALLOWED = "an allow rule allows it"
    GRANTED = "an approval's grant allows it"
    # An ask rule (or `unmatched: ask`): held for an operator; in report mode, would deny.
    ASKED = "held for an operator"
    # Denied by the tenant's own rules, and report mode lets it through (step 3, 4 or 6).
    WOULD_DENY = "would deny"


class Evaluation:
    """The request, who asks, the services the steps ask, and what the steps found so far.

    A finding is set by the step that finds it and read only by the steps after it (and the
    explainers); one not found is unset, or None where a later step asks whether it was found.
    """

    __slots__ = (
        "address",
        "bindings",
        "choice",
        "credentials",
        "dial",
        "engine",
        "grant",
        "grants",
        "guard",
        "identity",
        "ip",
        "match",
        "named",
        "outcome",
        "policy",
        "raw_tcp",
        "reason",
        "refused",
        "request",
        "reserved",
        "resolver",
        "rule",
        "rule_id",
        "skip",
        "tenant",
        "verdict",
        "who",
    )

    # What is asked, and the services that answer (set by whoever starts the evaluation).
    policy: PolicySet
    identity: Identity | None
    request: EgressRequest
    grants: Grants | None
    resolver: Resolver
    guard: AddressGuard
    engine: PolicyEngine | None
    # The address already pinned for this connection: re-checked, not re-resolved.
    address: str | None
    # The gateway's own name (approvals.endpoint_name), never a destination.
    reserved: str | None
    bindings: CredentialBindings | None
    # Counted grants step 4 passes over: those whose use could not be taken (sandgate.policy.decide).
    skip: frozenset[str]

    # Found by step 1: who asks (the identity, known to be there), and its tenant.
    who: Identity
    tenant: TenantPolicy
    # Step 2: the destination as an address, when it is a literal.
    ip: IPAddress | None
    # Steps 3-4: what the rules came to (None until they come to something), the rule that
    # decided (or the nearest one), the reason and rule id a would-deny records, whether a rule
    # names the host (only then do ranges the operator opens by name apply), the allow rules'
    # match (None when a deny rule decided), and the grant that allowed.
    outcome: RulesOutcome | None
    rule: CompiledRule | None
    rule_id: str | None
    reason: Reason
    raw_tcp: bool
    named: bool
    match: RuleMatch | None
    grant: Grant
    # Step 5: the address choice (a name's), the address to dial, those refused.
    choice: AddressChoice
    dial: str
    refused: tuple[Refusal, ...]
    # Step 6: Rego's verdict, when it was asked.
    verdict: RegoVerdict | None
    # The credentials bound to the destination (looked up once, by step 6 or 7).
    credentials: tuple[str, ...] | None

    def __init__(
        self, policy: PolicySet, identity: Identity | None, request: EgressRequest, grants: Grants | None
    ) -> None:
        self.policy = policy
        self.identity = identity
        self.request = request
        self.grants = grants
        self.skip = frozenset()
        self.outcome = None
        self.match = None
        self.verdict = None
        self.credentials = None

    def deny(
        self,
        reason: Reason,
        *,
        rule_id: str | None = None,
        detail: str = "",
        refused: tuple[Refusal, ...] = (),
    ) -> Decision:
        """A denial for `reason` in the tenant's mode (steps after identity: the tenant is known)."""
        return Decision(
            reason=reason,
            rule_id=rule_id,
            policy_version=self.policy.version,
            mode=self.tenant.mode,
            detail=detail,
            refused=refused,
        )

    def with_sections(self, decision: Decision) -> Decision:
        """`decision` with the protocol section that applies to its request, when it lets the
        request on (allowed, would-deny, or held for an operator, whose release keeps it).

        A section binds its rule's hosts (or networks) and ports: whichever rule, grant, ask or
        report mode let the request through, the section of every allow rule for the request's
        host and port applies, and of every one whose networks hold the address it dials. It
        needs interception, and no raw tunnel. Two different sections (the loader refuses that
        for names and for networks, but a name can resolve into a sectioned network): no one
        of them can decide, so the request is denied (`policy_error`).
        """
        if not (decision.allowed or decision.ask):
            return decision
        allow, r = self.tenant.allow, self.request
        found = {id(rule.messages): rule for rule in allow.section_rules(r.host, self.ip, r.port)}
        if self.ip is None and decision.address:
            for rule in allow.section_rules("", parse_ip(decision.address), r.port):
                found.setdefault(id(rule.messages), rule)
        if not found:
            return decision
        if len(found) > 1:
            names = " and ".join(f"{rule.rule_id} ({rule.origin})" for rule in found.values())
            detail = f"different protocol sections apply to this request: {names}; give it one"
            return decision.as_denial(Reason.POLICY_ERROR, detail)
        (rule,) = found.values()
        return replace(decision, messages=rule.messages, inspect=True, raw_tcp=False)

    def bound_credentials(self) -> tuple[str, ...]:
        """The credentials Rego's input names: the request's own, else those bound to its
        destination (looked up once per evaluation)."""
        if self.credentials is None:
            r = self.request
            if r.credentials or self.bindings is None:
                self.credentials = r.credentials
            else:
                self.credentials = self.bindings.bound_names(self.tenant.name, r.host, r.port)
        return self.credentials

    def rego_request(self) -> EgressRequest:
        """The request as Rego's input document shows it: with the credentials bound to it."""
        names = self.bound_credentials()
        return self.request if names == self.request.credentials else replace(self.request, credentials=names)

    @property
    def reports(self) -> bool:
        """The tenant is in report mode: its own rules' denials are recorded, not enforced."""
        return self.tenant.mode is Mode.REPORT
