"""What each step of sandgate.policy.steps found, as trace Steps (`policy explain`).

One explainer per step, called by `evaluate` after the step ran, only when a trace is asked
for: `found` is what the step returned (the Decision when it decided, else None), the rest
is read from the Evaluation.
"""

from __future__ import annotations

from sandgate.policy.address_choice import AddressChoice
from sandgate.policy.address_guard import IPAddress
from sandgate.policy.decision import Decision
from sandgate.policy.evaluation import Evaluation, RulesOutcome
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.input_document import input_document
from sandgate.policy.trace import AddressCheck, Outcome, RegoTrace, Step, StepName, Trace, address_checks

__all__ = [
    "address_guard",
    "allow_rules",
    "base_deny",
    "credentials",
    "dns_name",
    "identity",
    "rego",
    "reserved_name",
    "resolve",
    "tenant_deny",
]


def reserved_name(ev: Evaluation, found: Decision | None, trace: Trace) -> None:
    """Step 0, shown only when the request names the gateway's own name."""
    if found is not None:
        trace.add(StepName.RESERVED_NAME, Outcome.DENY, f"{ev.request.host} is {found.detail}")


def identity(ev: Evaluation, found: Decision | None, trace: Trace) -> None:
    if ev.identity is None:
        trace.add(StepName.IDENTITY, Outcome.DENY, "no sandbox identity")
    elif found is not None:
        trace.add(StepName.IDENTITY, Outcome.DENY, f"tenant {ev.identity.tenant!r} is not defined")
    else:
        detail = f"sandbox {ev.identity.sandbox} of tenant {ev.tenant.name}"
        trace.add(StepName.IDENTITY, Outcome.OK, detail)


def address_guard(ev: Evaluation, found: Decision | None, trace: Trace) -> None:
    if found is not None:
        refused = found.refused[0]
        checked = (AddressCheck(refused.address, "refused", refused.why),)
        trace.add(StepName.ADDRESS_GUARD, Outcome.DENY, refused.why, addresses=checked)
    else:
        trace.steps.append(_guard_passed(ev.request.host, ev.ip))


def _guard_passed(host: str, ip: IPAddress | None) -> Step:
    """Step 2 when the guard did not refuse: a name skips it, a literal may be dialled."""
    if ip is None:
        detail = f"{host} is a name: its addresses are checked in step {StepName.RESOLVE.number}"
        return Step(StepName.ADDRESS_GUARD, Outcome.SKIP, detail)
    dialled = (AddressCheck(str(ip), "dial"),)
    return Step(StepName.ADDRESS_GUARD, Outcome.OK, f"{ip} may be dialled", addresses=dialled)


def base_deny(ev: Evaluation, found: Decision | None, trace: Trace) -> None:
    """Step 3's first half: said only when the operator's rule denied (else the tenant's says)."""
    if found is not None:
        trace.add(StepName.DENY_RULES, Outcome.DENY, "the operator's base deny rule matches", ev.rule)


def tenant_deny(ev: Evaluation, found: Decision | None, trace: Trace) -> None:
    if found is not None:
        trace.add(StepName.DENY_RULES, Outcome.DENY, "the tenant's deny rule matches", ev.rule)
    elif ev.outcome is not None:
        trace.add(StepName.DENY_RULES, Outcome.WOULD_DENY, "the tenant's deny rule matches", ev.rule)
    else:
        trace.add(StepName.DENY_RULES, Outcome.OK, "no deny rule matches")


def allow_rules(ev: Evaluation, found: Decision | None, trace: Trace) -> None:
    """Step 4: the allow rule, grant or ask rule that matched, or why none did."""
    match, name = ev.match, StepName.ALLOW_RULES
    if match is None:
        trace.add(name, Outcome.SKIP, "a deny rule matched: allow rules are not asked")
    elif ev.outcome is RulesOutcome.ALLOWED:
        how = 'hosts: ["*"] matches (public addresses only)' if match.any_host else "an allow rule matches"
        trace.add(name, Outcome.OK, how, match.rule)
    elif ev.outcome is RulesOutcome.GRANTED:
        trace.add(name, Outcome.OK, f"granted by approval {ev.grant.id} ({ev.grant.scope})", ev.grant.rule)
    else:
        # Denied, asked, or (report mode) either let through: would deny.
        outcome = Outcome.WOULD_DENY if found is None and ev.reports else Outcome.DENY
        if ev.outcome is RulesOutcome.ASKED:
            how = "an ask rule matches" if ev.rule is not None else "unmatched: ask"
            trace.add(name, outcome, f"approval_required ({how})", ev.rule)
        elif match.nearest is not None:
            trace.add(name, outcome, f"{match.reason.value} (nearest rule)", match.nearest)
        else:
            trace.add(name, outcome, f"{match.reason.value}: no rule names this destination")


def resolve(ev: Evaluation, found: Decision | None, trace: Trace) -> None:
    if ev.ip is not None:
        trace.add(StepName.RESOLVE, Outcome.SKIP, f"{ev.ip} is an address")
    elif found is not None and found.reason is Reason.DNS_FAILURE:
        trace.add(StepName.RESOLVE, Outcome.DENY, f"cannot resolve: {found.detail}")
    else:
        trace.steps.append(_resolved(ev.request.host, ev.choice))


def _resolved(host: str, choice: AddressChoice) -> Step:
    """Step 5: what the name resolved to, and each address refused, dialled or not checked."""
    checked = address_checks(choice.candidates, choice.refused, choice.dial)
    resolved = f"{host} → {', '.join(choice.candidates)}"
    if choice.dial is None:
        denial = choice.denial
        detail = f"{resolved}: {denial.reason.value}, no address may be dialled"
        return Step(StepName.RESOLVE, Outcome.DENY, detail, denial.rule_id, addresses=checked)
    detail = resolved if len(choice.candidates) == 1 else f"{resolved}: dials {choice.dial}"
    return Step(StepName.RESOLVE, Outcome.OK, detail, addresses=checked)


def rego(ev: Evaluation, found: Decision | None, trace: Trace) -> None:
    """Step 6: held, skipped, or the verdict with the modules and input document it was given."""
    verdict, tenant = ev.verdict, ev.tenant
    if ev.outcome is RulesOutcome.ASKED and not ev.reports:
        trace.add(StepName.REGO, Outcome.SKIP, "held for approval: Rego is not consulted")
        return
    if verdict is None or tenant.rego is None:
        trace.add(StepName.REGO, Outcome.SKIP, "the tenant has no Rego: the allowlist decides alone")
        return
    if verdict.allowed:
        outcome = Outcome.OK
    elif verdict.fault:
        outcome = Outcome.ERROR
    else:
        outcome = Outcome.WOULD_DENY if ev.reports else Outcome.DENY
    detail = verdict.reason.value + (f": {verdict.message}" if verdict.message else "")
    trace.add(StepName.REGO, outcome, detail, rule_id=f"{tenant.name}/rego")
    modules = tuple(m.path for m in tenant.rego.modules)
    # The request as Rego saw it: with the credentials bound to it (step 7 names them).
    trace.rego = RegoTrace(modules, input_document(ev.who, ev.rego_request(), ev.dial), verdict)


def credentials(ev: Evaluation, found: Decision | None, trace: Trace) -> None:
    """Step 7, shown only when a credential of the tenant is bound to the destination."""
    if ev.credentials:
        r = ev.request
        names = ", ".join(ev.credentials)
        detail = (
            f"bound to {r.host}:{r.port}: {names} (injected by the broker; the connection is intercepted)"
        )
        trace.add(StepName.CREDENTIALS, Outcome.OK, detail)


def dns_name(ev: Evaluation, found: Decision | None, trace: Trace) -> None:
    """DNS step 2: answered (an allow rule or a grant names the name), or not looked up."""
    name = ev.request.host
    if found is not None and found.allowed:
        who = "an allow rule" if ev.outcome is RulesOutcome.ALLOWED else "a live grant"
        trace.add(StepName.DNS_NAME, Outcome.OK, f"{who} names {name}: resolved and answered")
    elif found is not None and found.rule_id is not None:
        trace.add(
            StepName.DNS_NAME, Outcome.DENY, "a deny rule refuses this name: it is not looked up", ev.rule
        )
    else:
        detail = f"no allow rule or grant names {name}: it is not looked up (NXDOMAIN)"
        trace.add(StepName.DNS_NAME, Outcome.DENY, detail)
