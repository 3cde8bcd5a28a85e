"""The embedded engine's fast path: the deny sets from rego-cpp, the decision from Python.

rego-cpp spends about half of an evaluation on the shipped decision rule's reduction (set
comprehensions, `min`, the `_denial` normalisation), not on the policies' own rules. When
the rules that make data.sandgate.decision are exactly the shipped ones, a bundle also gets
the small module below, and the engine asks it for the two raw deny sets (the operator's
`data.sandgate.deny`, the tenant's `data.sandgate.tenants[input.tenant].deny`) and reduces
them here, as the shipped rule does:

    no denial                      → {"allow": true, "reason": "allowed"}
    a string x                     → reason policy_denied, message x
    an object x                    → reason x.reason (default policy_denied), message x.message (default "")
    anything else                  → reason policy_denied, a fixed message
    several                        → the smallest reason, then the smallest message with it

A shape this reduction does not mirror exactly (a reason or message that is not a string)
is handed back to rego-cpp: the engine then evaluates data.sandgate.decision itself. An
operator who edits sandgate.rego's decision rules (or defines them elsewhere) gets the rule
as written, always. tests/policy/rego/test_deny_sets.py checks both paths agree.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandgate.policy.rego.program import RegoModule

__all__ = [
    "DENY_SETS_ENTRYPOINT",
    "DENY_SETS_MODULE",
    "DENY_SETS_MODULE_NAME",
    "SHIPPED_DECISION_DIGESTS",
    "fast_path_applies",
    "reduce_deny_sets",
]

DENY_SETS_ENTRYPOINT = "sandgate_gateway/deny_sets"
DENY_SETS_MODULE_NAME = "sandgate_gateway/deny_sets.rego"
DENY_SETS_MODULE = """package sandgate_gateway

import rego.v1

# The two deny sets data.sandgate.decision reduces (sandgate.policy.rego.deny_sets).
deny_sets := [_operator, _tenant]

_operator := x if {
	x := data.sandgate.deny
} else := set()

_tenant := x if {
	x := data.sandgate.tenants[input.tenant].deny
} else := set()
"""

# SHA-256 of each shipped rules/rego/sandgate.rego whose decision rules the reduction mirrors.
SHIPPED_DECISION_DIGESTS = frozenset(
    {
        "613a8a9b9402d76558ae8a56e4319db97cffa315956d0ef2e65fc8dcb5606944",  # input version 1 only
        "812944ad32d4912b30181d36f8877a9967f3141d7a6e8224d85897d52f29e007",  # input versions 1 and 2
    }
)

# The rules that make the decision; defined anywhere but the shipped module, they turn the fast path off.
_DECISION_RULES = frozenset({"decision", "denials", "_denial"})
_NEITHER = "a deny rule produced neither a string nor an object"
_POLICY_DENIED = "policy_denied"


def fast_path_applies(modules: Iterable[RegoModule]) -> bool:
    """Whether the decision rules in `modules` are exactly the shipped ones (and nothing else's)."""
    found = False
    for m in modules:
        if m.facts.package != ("sandgate",) or not (m.facts.heads & _DECISION_RULES):
            if m.facts.package == ("sandgate_gateway",):
                return False  # someone else's module in the reserved package
            continue
        if found or hashlib.sha256(m.text.encode()).hexdigest() not in SHIPPED_DECISION_DIGESTS:
            return False
        found = True
    return found


def reduce_deny_sets(text: str) -> dict[str, Any] | None:
    """The decision document from rego-cpp's deny_sets output; None when rego-cpp must decide."""
    try:
        parsed = json.loads(text)
        operator, tenant = parsed["expressions"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(operator, list) or not isinstance(tenant, list):
        return None
    if not operator and not tenant:
        return {"allow": True, "reason": "allowed"}
    best: tuple[str, str] | None = None
    for x in (*operator, *tenant):
        if isinstance(x, str):
            found = (_POLICY_DENIED, x)
        elif isinstance(x, dict):
            reason, message = x.get("reason", _POLICY_DENIED), x.get("message", "")
            if not isinstance(reason, str) or not isinstance(message, str):
                return None  # Rego orders values of mixed types its own way: let it decide
            found = (reason, message)
        else:
            found = (_POLICY_DENIED, _NEITHER)
        if best is None or found < best:
            best = found
    assert best is not None
    return {"allow": False, "reason": best[0], "message": best[1]}
