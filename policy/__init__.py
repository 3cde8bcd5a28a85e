"""sandgate policy: the decision core. Pure: no mitmproxy, no brokers, no proxy import.

`decide()` (decide.py) is the evaluation order, written once; `model/` is what policy files
say (tenant and credential schema, loading), `rego/` the Rego engines behind one protocol.

Re-exported here: the values a decision is made of and the errors, which load nothing but
the standard library. Import the rest from its module: `decide`, `explain` and `policytests`
build Rego engines (regopy, the OPA client), `resolver` loads dnspython and `limiter` the
tenant schema; importing this package must stay cheap for everything under it.
"""

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decision import Decision, EgressRequest, Identity, Mode, Phase, Refusal
from sandgate.policy.errors import (
    HostError,
    PolicyError,
    PolicyLoadError,
    PolicySetError,
    ResolveError,
    SandgateError,
    SecretReferenceError,
    SourceLocation,
    TokenFileMissingError,
    TokenReferenceError,
)
from sandgate.policy.reasons import Reason

__all__ = [
    "AddressGuard",
    "Decision",
    "EgressRequest",
    "HostError",
    "Identity",
    "Mode",
    "Phase",
    "PolicyError",
    "PolicyLoadError",
    "PolicySetError",
    "Reason",
    "Refusal",
    "ResolveError",
    "SandgateError",
    "SecretReferenceError",
    "SourceLocation",
    "TokenFileMissingError",
    "TokenReferenceError",
]
