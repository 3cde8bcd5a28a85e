"""A loaded, immutable policy: every tenant compiled, every sandbox registered.

A PolicySet is built off the hot path and swapped in by one reference assignment, so a
request sees either the old policy or the new one, never half of each.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sandgate.policy.decision import Identity, Mode
from sandgate.policy.matcher import CompiledRule, RuleIndex
from sandgate.policy.model.grants import EMPTY_GRANTS, Grants
from sandgate.policy.model.sandbox_tokens import digest_token, tokens_equal
from sandgate.policy.rego.program import RegoProgram

if TYPE_CHECKING:
    from sandgate.policy.model.tenant import Limits

__all__ = ["LoadNotice", "PolicySet", "SandboxRecord", "TenantPolicy", "TenantProblem"]


@dataclass(frozen=True, slots=True)
class SandboxRecord:
    """A registered sandbox: its tenant and the digest of its proxy token."""

    sandbox: str
    tenant: str
    token_digest: bytes | None = field(repr=False)
    addresses: tuple[str, ...] = ()
    # The host-side interface whose host rules make `addresses` unforgeable (None: the operator's).
    interface: str | None = None
    # Where its token comes from, as the tenant file names it ('file:' made absolute, 'env:',
    # 'sha256:'; a registered sandbox's is its 'sha256:' digest), for telling an operator how
    # to connect: a reference, never the token. None: no token.
    token_ref: str | None = None
    # Where it is defined ("file:line" of a tenant file, "registry PATH", "redis"), for listings.
    origin: str = ""


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """One tenant's compiled rules, with the operator's base deny rules beside its own."""

    name: str
    mode: Mode
    allow: RuleIndex
    deny: RuleIndex
    # The operator's base deny rules: the same index for every tenant, never relaxed.
    base_deny: RuleIndex
    source: str
    # The tenant's ask rules (held for an operator's approval when no allow rule allows), and
    # whether a request no rule matches is asked about too (`unmatched: ask`).
    ask: RuleIndex = field(default_factory=lambda: RuleIndex(()))
    unmatched_ask: bool = False
    # The grants of its grants file (`<tenant>.grants.yaml`): allow rules approvals added for
    # the whole tenant (sandgate.policy.model.grants), looked at after its allow rules.
    grants: Grants = EMPTY_GRANTS
    # The tenant's credential declarations (sandgate.brokers.Credential), for the broker.
    credentials: tuple[Any, ...] = ()
    # The tenant's Rego (its modules, the operator's, its data, the compiled bundle), or None:
    # then the allowlist decides alone.
    rego: RegoProgram | None = None
    # The tenant's `limits:`, or None: no limits.
    limits: Limits | None = None
    # The sandboxes its file declares (the registry's are added to the PolicySet only), so a
    # tenant kept at its last good version after a failed reload keeps them too.
    sandboxes: tuple[SandboxRecord, ...] = ()
    # What the tenant was loaded from (its file, tokens and Rego), for the policy version.
    digest: str = ""

    def refuses_name(self, host: str) -> CompiledRule | None:
        """The deny rule that refuses every request to `host` (the operator's always, the
        tenant's own unless it is in report mode), or None. Such a name is not looked up: a
        lookup reaches the name's nameservers, a channel out of the sandbox of its own."""
        rule = self.base_deny.denies_name(host)
        if rule is None and self.mode is not Mode.REPORT:
            rule = self.deny.denies_name(host)
        return rule


@dataclass(frozen=True, slots=True)
class LoadNotice:
    """Something a load noticed that is no error (a sandbox whose token file does not exist yet)."""

    origin: str  # file:line:column
    field: str
    text: str

    def __str__(self) -> str:
        return f"{self.origin}: {self.field}: {self.text}"


@dataclass(frozen=True, slots=True)
class TenantProblem:
    """A tenant file that did not load, and what the gateway serves for it instead."""

    file: str
    # The tenant's name when known (from the file, or from its last good version).
    tenant: str | None
    errors: tuple[str, ...]
    # True: its last good version is still served; False: it has no policy (no_identity).
    kept_last_good: bool


# Compared against when the sandbox id is unknown, so a miss costs the same as a hit.
_DUMMY_DIGEST = digest_token("sandgate-unknown-sandbox")


@dataclass(frozen=True, slots=True)
class PolicySet:
    """Everything the gateway decides with, at one version."""

    version: str
    tenants: Mapping[str, TenantPolicy]
    sandboxes: Mapping[str, SandboxRecord]
    by_address: Mapping[str, SandboxRecord]
    files: tuple[str, ...] = ()
    # Token files referenced by sandboxes: a reload watches them too.
    token_files: tuple[str, ...] = ()
    # Rego modules the tenants use (the operator's and their own): a reload watches them too.
    rego_files: tuple[str, ...] = ()
    # Tenant files that failed to load while the rest did (isolated loading), and notes that
    # are not errors (a sandbox whose token file does not exist yet).
    problems: tuple[TenantProblem, ...] = ()
    notices: tuple[LoadNotice, ...] = ()

    def authenticate(self, sandbox_id: str, token: str) -> Identity | None:
        """The identity for a sandbox id and proxy token, compared in constant time."""
        record = self.sandboxes.get(sandbox_id)
        digest = record.token_digest if record and record.token_digest else _DUMMY_DIGEST
        ok = tokens_equal(token, digest)
        if record is None or record.token_digest is None or not ok:
            return None
        return Identity(tenant=record.tenant, sandbox=record.sandbox)

    def identify_address(self, address: str) -> Identity | None:
        """The identity for a source address (transparent mode; the host prevents spoofing)."""
        try:
            key = str(ipaddress.ip_address(address))
        except ValueError:
            return None
        record = self.by_address.get(key)
        return Identity(record.tenant, record.sandbox) if record else None

    def tenant(self, name: str) -> TenantPolicy | None:
        """A tenant's policy, or None when it is not (or no longer) defined."""
        return self.tenants.get(name)
