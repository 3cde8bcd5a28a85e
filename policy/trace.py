"""What `decide` did, step by step: recorded only when a `Trace` is passed to it.

`policy explain` renders a trace; the gateway passes none, so its decisions record nothing.
Each step's number is its place in `decide`'s docstring (the evaluation order), or in
`decide_name`'s for the DNS listener's order. Steps 1-6 are listed in every explanation of a
request (taken, or not reached); the reserved name (0) and credentials (7) only when they apply.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sandgate.policy.decision import Refusal
from sandgate.policy.matcher import CompiledRule
from sandgate.policy.rego.protocol import RegoVerdict

__all__ = [
    "DNS_ORDER",
    "REQUEST_ORDER",
    "AddressCheck",
    "Outcome",
    "RegoTrace",
    "Step",
    "StepName",
    "Trace",
    "address_checks",
]


class StepName(StrEnum):
    """The steps of `decide` in its order, then the DNS listener's own (`decide_name`)."""

    RESERVED_NAME = "reserved name"
    IDENTITY = "identity"
    ADDRESS_GUARD = "address guard"
    DENY_RULES = "deny rules"
    ALLOW_RULES = "allow rules"
    RESOLVE = "resolve"
    REGO = "rego"
    CREDENTIALS = "credentials"
    DNS_NAME = "dns name"

    @property
    def number(self) -> int:
        return _NUMBERS[self]


# A step's number in its docstring: `decide`'s 0-7, and `decide_name`'s step 2.
_NUMBERS: dict[StepName, int] = {name: i for i, name in enumerate(StepName) if name is not StepName.DNS_NAME}
_NUMBERS[StepName.DNS_NAME] = 2

# The steps an explanation lists whether taken or not: of a request, and of a DNS query.
REQUEST_ORDER = (
    StepName.IDENTITY,
    StepName.ADDRESS_GUARD,
    StepName.DENY_RULES,
    StepName.ALLOW_RULES,
    StepName.RESOLVE,
    StepName.REGO,
)
DNS_ORDER = (StepName.IDENTITY, StepName.DNS_NAME)


class Outcome(StrEnum):
    """What one step came to; `would deny` is a denial report mode let through."""

    OK = "ok"
    SKIP = "skip"
    DENY = "deny"
    WOULD_DENY = "would deny"
    ERROR = "error"
    NOT_REACHED = "not reached"


@dataclass(frozen=True, slots=True)
class AddressCheck:
    """One address the guard looked at (steps 2 and 5): `dial`, `refused` (with why) or
    `not checked` (after the one dialled)."""

    address: str
    result: str
    why: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"address": self.address, "result": self.result, "why": self.why}


@dataclass(frozen=True, slots=True)
class Step:
    """One step of the evaluation order: what it found, and the rule when one matched."""

    name: StepName
    outcome: Outcome
    detail: str
    rule_id: str | None = None
    origin: str | None = None
    addresses: tuple[AddressCheck, ...] = ()

    @property
    def number(self) -> int:
        return self.name.number

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.number,
            "name": self.name.value,
            "outcome": self.outcome.value,
            "detail": self.detail,
            "rule_id": self.rule_id,
            "origin": self.origin,
        }
        if self.addresses:
            out["addresses"] = [a.as_dict() for a in self.addresses]
        return out


@dataclass(frozen=True, slots=True)
class RegoTrace:
    """Step 6 in full: the tenant's modules, the input document, and the verdict."""

    modules: tuple[str, ...]
    input: Mapping[str, Any]
    verdict: RegoVerdict


class Trace:
    """The steps one `decide` call took, in order (pass a fresh one per call)."""

    __slots__ = ("rego", "steps")

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.rego: RegoTrace | None = None

    def add(
        self,
        name: StepName,
        outcome: Outcome,
        detail: str,
        rule: CompiledRule | None = None,
        *,
        rule_id: str | None = None,
        addresses: tuple[AddressCheck, ...] = (),
    ) -> None:
        """Record a step; `rule` is the rule that matched (its id and where it was written)."""
        origin = None
        if rule is not None:
            rule_id, origin = rule.rule_id, rule.origin or None
        self.steps.append(Step(name, outcome, detail, rule_id, origin, addresses))

    def padded(self, order: tuple[StepName, ...] = REQUEST_ORDER) -> tuple[Step, ...]:
        """The steps taken, and those of `order` not taken as not reached, in step order."""
        taken = {s.name for s in self.steps}
        rest = [Step(name, Outcome.NOT_REACHED, "") for name in order if name not in taken]
        return tuple(sorted((*self.steps, *rest), key=lambda s: s.number))


def address_checks(
    candidates: tuple[str, ...], refused: tuple[Refusal, ...], dial: str | None
) -> tuple[AddressCheck, ...]:
    """Each resolved address in order: refused (why), dialled, or not checked after the dial.
    Every address before the dialled one was refused, in order (the first MAX_REFUSALS kept)."""
    dial_at = len(candidates)
    if dial is not None:
        dial_at = next((i for i, text in enumerate(candidates) if _canonical(text) == dial), dial_at)
    out: list[AddressCheck] = []
    for i, text in enumerate(candidates):
        if i < dial_at:
            why = refused[i].why if i < len(refused) else "refused (not kept: too many refusals)"
            out.append(AddressCheck(text, "refused", why))
        else:
            out.append(AddressCheck(text, "dial" if i == dial_at else "not checked"))
    return tuple(out)


def _canonical(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text
