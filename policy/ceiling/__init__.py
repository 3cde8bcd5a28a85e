"""The operator's ceiling and its prover: whether tenant rules (or a proposed rule) allow any
request outside it, with a counter-example when they do. Pure: no I/O beyond reading files.

`excess(rule, ceiling.regions)` answers for one rule (what automatic approval asks; any
exception it raises, ProofTooLarge or other, means "not inside");
`lookup_excess(rule, ceiling)` a name the rule makes the gateway look up that no region names;
`overlap(rule, ceiling.always_human)` whether a rule touches what only a person may grant;
`prove_tenants` runs the check over a loaded policy (`sandgate policy prove`).
"""

from sandgate.policy.ceiling.effective import TenantRules, effective_rules
from sandgate.policy.ceiling.model import Ceiling, CeilingFile, Region, load_ceiling
from sandgate.policy.ceiling.pathlang import ProofTooLarge
from sandgate.policy.ceiling.prove import CounterExample, excess, lookup_excess, overlap
from sandgate.policy.ceiling.report import Excess, Proof, prove_tenants
from sandgate.policy.ceiling.sets import RAW_TCP
from sandgate.policy.ceiling.shape import RuleShape, ports_of

__all__ = [
    "RAW_TCP",
    "Ceiling",
    "CeilingFile",
    "CounterExample",
    "Excess",
    "Proof",
    "ProofTooLarge",
    "Region",
    "RuleShape",
    "TenantRules",
    "effective_rules",
    "excess",
    "load_ceiling",
    "lookup_excess",
    "overlap",
    "ports_of",
    "prove_tenants",
]
