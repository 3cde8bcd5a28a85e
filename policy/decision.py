"""The values that flow through a decision: what is asked, who asks, and the answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from .reasons import Reason

__all__ = ["RELAXABLE_IN_REPORT_MODE", "Decision", "EgressRequest", "Identity", "Mode", "Phase"]


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
    detail: str = field(default="", compare=False)

    @property
    def verdict(self) -> str:
        """`allow`, `deny` or `would_deny`, as written to the audit trail."""
        if self.report_only:
            return "would_deny"
        return "allow" if self.allowed else "deny"
