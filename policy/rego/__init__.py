"""Rego on the decision path: the `PolicyEngine` protocol, the decision cache, the embedded
engine (rego-cpp in process), the OPA server client, and compiling bundles in worker processes.

Re-exported here: the protocol (query, verdict, the reading of a decision document) and the
program a tenant's modules make. The engines stay in their modules (`engine.make_engine`,
`embedded`, `opa`, `cache`, `compiler`): they load regopy and the OPA client, which the
policy set, holding programs, must not.
"""

from sandgate.policy.rego.program import DECISION_ENTRYPOINT, DECISION_QUERY, RegoModule, RegoProgram
from sandgate.policy.rego.protocol import (
    REGO_REASONS,
    UNDEFINED,
    EngineError,
    PolicyEngine,
    RegoQuery,
    RegoVerdict,
    fault,
    interpret,
)

__all__ = [
    "DECISION_ENTRYPOINT",
    "DECISION_QUERY",
    "REGO_REASONS",
    "UNDEFINED",
    "EngineError",
    "PolicyEngine",
    "RegoModule",
    "RegoProgram",
    "RegoQuery",
    "RegoVerdict",
    "fault",
    "interpret",
]
