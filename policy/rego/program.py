"""A tenant's Rego policy, ready to evaluate: its modules, its data, what it reads, its bundle.

Built by the loader (off the hot path) and held by the tenant's TenantPolicy, so it is
swapped together with the rest of the PolicySet. The embedded engine evaluates the bundle
compiled into `bundle_file`; the opa engine asks a server that was given the same modules
and data (`policy push`).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sandgate.policy.rego.deny_sets import DENY_SETS_MODULE, fast_path_applies
from sandgate.policy.rego.input_document import PathTree, path_tree
from sandgate.policy.rego.source import NONDETERMINISTIC_BUILTINS, InputPaths, ModuleFacts, merge_paths

__all__ = ["DECISION_ENTRYPOINT", "DECISION_QUERY", "RegoModule", "RegoProgram", "tenant_package"]

# The rule the gateway evaluates: data.sandgate.decision.
DECISION_QUERY = "data.sandgate.decision"
DECISION_ENTRYPOINT = "sandgate/decision"


def tenant_package(tenant: str) -> tuple[str, ...]:
    """The package a tenant's own modules live in: sandgate.tenants.<tenant>."""
    return ("sandgate", "tenants", tenant)


@dataclass(frozen=True, slots=True)
class RegoModule:
    """One module: where it came from, its text, and what a scan of it found."""

    path: str
    text: str = field(repr=False)
    facts: ModuleFacts = field(repr=False, compare=False)
    # True for the operator's modules (rules/rego/*.rego), which every Rego tenant gets.
    operator: bool = False

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True, slots=True, eq=False)
class RegoProgram:
    """A tenant's compiled Rego: operator modules, its own modules, and its data."""

    tenant: str
    modules: tuple[RegoModule, ...]
    data: Mapping[str, Any] = field(repr=False)
    # The compiled bundle's file in the bundle store (embedded engine); None until compiled.
    bundle_file: str | None = field(default=None, repr=False)
    digest: str = field(init=False)
    input_paths: InputPaths = field(init=False, repr=False)
    tree: PathTree | None = field(init=False, repr=False)
    deterministic: bool = field(init=False)
    # The bundle also answers DENY_SETS_ENTRYPOINT, reduced in Python (policy/rego/deny_sets.py).
    fast_path: bool = field(init=False)

    def __post_init__(self) -> None:
        fast = fast_path_applies(self.modules)
        object.__setattr__(self, "fast_path", fast)
        h = hashlib.sha256(f"{DECISION_ENTRYPOINT}\0{self.tenant}\0".encode())
        if fast:
            h.update(f"fast\0{DENY_SETS_MODULE}\0".encode())
        for m in self.modules:
            h.update(f"{m.path}\0{m.digest}\0".encode())
        h.update(json.dumps(self.data, sort_keys=True, separators=(",", ":")).encode())
        object.__setattr__(self, "digest", h.hexdigest())
        paths = merge_paths(m.facts.input_paths for m in self.modules)
        object.__setattr__(self, "input_paths", paths)
        object.__setattr__(self, "tree", path_tree(paths))
        used = set().union(*(m.facts.builtins for m in self.modules)) if self.modules else set()
        object.__setattr__(self, "deterministic", not (used & NONDETERMINISTIC_BUILTINS))

    @property
    def reads_request(self) -> bool:
        """Whether the policy reads `input.request`: then every tunnel must be intercepted."""
        return self.input_paths is None or any(p[0] == "request" for p in self.input_paths)

    @property
    def own_modules(self) -> tuple[RegoModule, ...]:
        """The modules the tenant file lists (not the operator's)."""
        return tuple(m for m in self.modules if not m.operator)

    def data_document(self) -> dict[str, Any]:
        """The base document compiled into the bundle: data.tenants.<tenant>."""
        return {"tenants": {self.tenant: dict(self.data)}}

    def compiled(self, bundle_file: str) -> RegoProgram:
        """The same program, compiled into `bundle_file` (what was derived is not derived again)."""
        done = copy.copy(self)
        object.__setattr__(done, "bundle_file", bundle_file)
        return done
