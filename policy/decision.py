"""The values that flow through a decision: what is asked, who asks, and the answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from sandgate.policy.reasons import Reason

if TYPE_CHECKING:  # pydantic models: loaded with the policy files, not with every decision
    from sandgate.policy.protocols.rules import GraphqlSection, JsonRpcSection, McpSection

__all__ = ["RELAXABLE_IN_REPORT_MODE", "Decision", "EgressRequest", "Identity", "Mode", "Phase", "Refusal"]


class Phase(StrEnum):
    """The layer at which a decision is taken."""

    CONNECT = "connect"
    TLS = "tls"
    REQUEST = "request"
    DNS = "dns"


class Mode(StrEnum):
    """A tenant's enforcement mode: `report` allows and records would-deny decisions."""

    ENFORCE = "enforce"
    REPORT = "report"


# Report mode relaxes the tenant's own rules only; the operator's address guard, identity,
# Host/SNI binding and faults stay enforced so report mode never opens the metadata service.
RELAXABLE_IN_REPORT_MODE = frozenset(
    {
        Reason.HOST_NOT_ALLOWED,
        Reason.HOST_DENIED,
        Reason.PORT_NOT_ALLOWED,
        Reason.METHOD_NOT_ALLOWED,
        Reason.PATH_NOT_ALLOWED,
        Reason.POLICY_DENIED,
        Reason.UPGRADE_NOT_ALLOWED,
    }
)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who sent a connection, established from where it came, never from what it says."""

    tenant: str
    sandbox: str


@dataclass(frozen=True, slots=True)
class EgressRequest:
    """One question to the policy: may this sandbox reach this destination now?

    `host` is normalised (lowercase A-labels, or a canonical IP literal); `path` is the
    normalised path without query, or None before the HTTP layer. The fields after `sni`
    feed the Rego input document only: `query` is the raw query string, `headers` the
    request's (name, value) pairs as sent, `body_size` the declared length, `client` the
    guest's address, `credentials` the names of the credentials the broker would use.
    `upgrade` is the protocol switch the request asks for (`websocket`; see
    sandgate.policy.upgrade), which only an allow rule with `websocket: true` admits.
    """

    phase: Phase
    host: str
    port: int
    scheme: str | None = None
    method: str | None = None
    path: str | None = None
    sni: str | None = None
    query: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    body_size: int | None = None
    client: str | None = None
    credentials: tuple[str, ...] = ()
    upgrade: str | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """An address the gateway would not dial for a request, and why. Addresses are no secret:
    they go to the audit trail, `policy explain` and the guest's 403 body."""

    address: str
    # A sentence that names the address: "10.1.5.3 is a private address the operator does not ...".
    why: str
    # The address class (sandgate.policy.addresses.AddressClass), `own` for the gateway's own
    # addresses, `deny_rule` for an address a deny network covers.
    kind: str
    rule_id: str | None = None

    def as_dict(self) -> dict[str, object]:
        """The refusal as written to the audit trail and the 403 body."""
        out: dict[str, object] = {"address": self.address, "kind": self.kind, "why": self.why}
        if self.rule_id is not None:
            out["rule_id"] = self.rule_id
        return out


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer. The zero value denies: a forgotten field never means allow."""

    allowed: bool = False
    reason: Reason = Reason.INTERNAL_ERROR
    rule_id: str | None = None
    policy_version: str = ""
    mode: Mode = Mode.ENFORCE
    # True when the tenant is in report mode and this would have been denied.
    report_only: bool = False
    # Intercept TLS (True) or pass the tunnel through untouched (False).
    inspect: bool = False
    # The address the gateway resolved, checked and will dial; None for denials.
    address: str | None = None
    # The matched rule lets raw TCP bytes through (`protocol: tcp`).
    raw_tcp: bool = False
    # No allow rule allows it and an ask rule (or `unmatched: ask`) matched: hold the request
    # for an operator's decision (sandgate.proxy.approvals); `allowed` stays False until then.
    ask: bool = False
    # The allow rule's `mcp:`, `jsonrpc:` or `graphql:` section: the request's body is decided by it too
    # (sandgate.proxy.addons.agent_protocols) before it goes upstream.
    messages: McpSection | JsonRpcSection | GraphqlSection | None = field(default=None, compare=False)
    # Released by an approval: (the access request's id, who approved it), for the audit record.
    approval: tuple[str, str | None] | None = field(default=None, compare=False)
    detail: str = field(default="", compare=False)
    # The addresses refused on the way (step 2 or 5), in the order they were checked.
    refused: tuple[Refusal, ...] = field(default=(), compare=False)

    @classmethod
    def internal_error(
        cls, policy_version: str, detail: str = "", *, mode: Mode = Mode.ENFORCE, address: str | None = None
    ) -> Decision:
        """A gateway fault's denial (`internal_error`): never a policy's answer. `mode` and
        `address`: those of the decision the fault interrupted, when there was one."""
        return cls(
            reason=Reason.INTERNAL_ERROR,
            policy_version=policy_version,
            mode=mode,
            address=address,
            detail=detail,
        )

    def as_denial(self, reason: Reason, detail: str = "") -> Decision:
        """This decision turned into a denial for `reason`, keeping its rule, policy version,
        mode and address (the context an audit record of a later refusal carries)."""
        return Decision(
            reason=reason,
            rule_id=self.rule_id,
            policy_version=self.policy_version,
            mode=self.mode,
            address=self.address,
            detail=detail,
            approval=self.approval,
        )

    @property
    def verdict(self) -> str:
        """`allow`, `deny` or `would_deny`, as written to the audit trail (a held request's
        record says `ask`: sandgate.proxy.approvals.holds writes it)."""
        if self.report_only:
            return "would_deny"
        return "allow" if self.allowed else "deny"
