"""State shared by sandgate's addons: the policy in force, per-connection facts, services."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sandgate.brokers import Broker
from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import credential_interception, decide
from sandgate.policy.decision import Decision, EgressRequest, Identity, Phase
from sandgate.policy.limiter import Limiter
from sandgate.policy.model.grants import EMPTY_GRANTS, Grants
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.model.tenant import Limits
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.protocol import PolicyEngine
from sandgate.policy.resolver import Resolver
from sandgate.proxy.approvals.reserved import ReservedName
from sandgate.proxy.audit.records import DecisionContext
from sandgate.proxy.audit.refusals import RefusalAudit
from sandgate.proxy.audit.trail import AuditLog
from sandgate.proxy.dns.name_bindings import NameBindings
from sandgate.proxy.metrics import METRICS

__all__ = ["ConnectionState", "FrontDecision", "GatewayContext", "decision_context"]


@dataclass(slots=True)
class ConnectionState:
    """What the gateway has established about one client connection.

    Addons read the fields; they change them only through the transitions below, so every
    way a connection's facts can change is in this one place (as h11's `_state.py` does):

        identified(identity)              the proxy credential named a sandbox
        arrived(original_dst, identity)   transparent: where the guest connected, who it is
        raw_approved(address, port, name) transparent: a `protocol: tcp` rule allowed it at connect
        tunnel_approved(host, port, d)    a CONNECT (or transparent ClientHello) was allowed
        tls_accepted(sni, passthrough)    the ClientHello fits the tunnel
        permit_dial(address, port, host)  a request outside a tunnel was allowed to this address
        refused(reason)                   a layer denied: no upstream connection opens after this
    """

    listener: str
    client: str
    identity: Identity | None = None
    # Transparent mode: where the guest was connecting (the original destination).
    transparent: bool = False
    original_dst: tuple[str, int] | None = None
    # Raw TCP approved at connect (`protocol: tcp` rule): bytes pass, no layer is parsed.
    raw: bool = False
    # Set once a CONNECT (or transparent connection) is approved: the tunnel's destination.
    tunnel_host: str | None = None
    tunnel_port: int | None = None
    tunnel_decision: Decision | None = None
    passthrough: bool = False
    sni: str | None = None
    # Set when a later layer denies: no upstream connection may be opened after this.
    denied: Reason | None = None
    # Addresses this connection may dial, and the name each was allowed for (upstream SNI).
    dial_permits: dict[tuple[str, int], str] = field(default_factory=dict)

    @property
    def in_tunnel(self) -> bool:
        return self.tunnel_host is not None

    # -- transitions -------------------------------------------------------------------------

    def identified(self, identity: Identity) -> None:
        """The connection's proxy credential named this sandbox."""
        self.identity = identity

    def arrived(self, original_dst: tuple[str, int], identity: Identity | None) -> None:
        """Transparent mode: the guest connected to `original_dst`, from `identity`'s address."""
        self.original_dst = original_dst
        self.identity = identity

    def raw_approved(self, address: str, port: int, name: str) -> None:
        """Transparent raw TCP allowed at connect: bytes to address:port pass (upstream SNI `name`)."""
        self.raw = True
        self.dial_permits[(address, port)] = name

    def tunnel_approved(self, host: str, port: int, decision: Decision) -> None:
        """A tunnel to host:port was allowed: it may dial the address the decision checked."""
        if decision.address is None:
            raise ValueError("an approved tunnel needs the checked address")
        self.tunnel_host, self.tunnel_port, self.tunnel_decision = host, port, decision
        self.dial_permits[(decision.address, port)] = host

    def tls_accepted(self, sni: str | None, *, passthrough: bool) -> None:
        """The tunnel's ClientHello fits it: intercepted, or passed through untouched."""
        self.sni = sni
        self.passthrough = passthrough

    def permit_dial(self, address: str, port: int, host: str) -> str | None:
        """A request to `host` was allowed: the connection may dial address:port for it.
        Returns the host permitted there before (for `withdraw`)."""
        before = self.dial_permits.get((address, port))
        self.dial_permits[(address, port)] = host
        return before

    def withdraw(self, address: str, port: int, before: str | None) -> None:
        """A request permitted by `permit_dial` was refused after all: back to what was permitted before."""
        if before is None:
            self.dial_permits.pop((address, port), None)
        else:
            self.dial_permits[(address, port)] = before

    def refused(self, reason: Reason) -> None:
        """A layer denied: the chokepoint opens no upstream connection for it from now on."""
        self.denied = reason

    # -- reading -----------------------------------------------------------------------------

    def decision_context(self, phase: Phase, *, sni: str | None = None) -> DecisionContext:
        """The audit context of a decision on this connection: who, from where, to its tunnel
        (with the ClientHello's `sni`, for a TLS decision)."""
        return DecisionContext(
            phase=phase,
            listener=self.listener,
            client=self.client,
            host=self.tunnel_host,
            port=self.tunnel_port,
            sni=sni,
            identity=self.identity,
        )


def decision_context(state: ConnectionState | None, phase: Phase, listener: str = "-") -> DecisionContext:
    """The state's decision context; for a connection without state, one naming only `listener`."""
    if state is None:
        return DecisionContext(phase=phase, listener=listener, client="-")
    return state.decision_context(phase)


@dataclass(frozen=True, slots=True)
class FrontDecision:
    """A CONNECT the passthrough front decided before it handed the connection to mitmproxy
    (sandgate.proxy.front): the tunnel gate goes on with it instead of deciding again."""

    identity: Identity
    host: str
    port: int
    # Allowed, with the credential broker's interception applied.
    decision: Decision
    # The front answered the CONNECT itself and wrote its record (the tunnel's first bytes
    # were no ClientHello it reads): mitmproxy's answer to the replayed CONNECT is not the
    # guest's, and the tunnel gate does not record it twice.
    recorded: bool

    def reusable(
        self, identity: Identity | None, host: str, port: int, policy_version: str
    ) -> Decision | None:
        """The decision, when it is about this CONNECT under the policy in force; else None."""
        if (identity, host, port, policy_version) != (
            self.identity,
            self.host,
            self.port,
            self.decision.policy_version,
        ):
            return None
        return self.decision


class GatewayContext:
    """The policy in force and the services addons call. `policy` is swapped whole on reload."""

    def __init__(
        self,
        policy: PolicySet,
        resolver: Resolver,
        guard: AddressGuard,
        audit: AuditLog,
        bindings: NameBindings | None = None,
        *,
        reroute: bool = False,
        broker: Broker | None = None,
        engine: PolicyEngine | None = None,
    ) -> None:
        self.policy = policy
        self.resolver = resolver
        self.guard = guard
        self.audit = audit
        # Refusals that anyone who can connect could repeat at will, one record per source and
        # second (started and stopped by the ConnectionLimits addon).
        self.refusals = RefusalAudit(audit.emit)
        self.bindings = bindings or NameBindings()
        # Transparent mode: dial a name's pinned address even when the guest chose another IP.
        self.reroute = reroute
        self.broker = broker
        # Evaluates tenants' Rego (step 6 of decide); None: decide's default embedded engine.
        self.engine = engine
        # The gateway's grants beyond the tenants' grants files (sandbox scope; tenant scope in
        # a fleet): swapped whole by sandgate.proxy.approvals.GrantBook.
        self.grants: Grants = EMPTY_GRANTS
        self.connections: dict[str, ConnectionState] = {}
        # CONNECTs the passthrough front decided before it handed their connection to mitmproxy,
        # by the guest's address (sandgate.proxy.front): the tunnel gate reuses the decision.
        self.front_decided: dict[object, FrontDecision] = {}
        # Tenants' rate and size limits: local counters (merged with the fleet's by LimitSync).
        self.limiter = Limiter()
        # Fleet mode: learn the fleet's counts before the first decisions on a sandbox new here.
        self.limit_learn: Callable[[str, str, Limits | None], Awaitable[None]] | None = None
        # The name the gateway answers itself (sandgate.proxy.approvals.reserved): never decided
        # as a destination, so no rule can make it resolved or dialled.
        self.reserved: ReservedName | None = None

    async def decide(
        self, identity: Identity | None, request: EgressRequest, *, address: str | None = None
    ) -> Decision:
        """The policy's decision: every step of sandgate.policy.decide, from the reserved name
        to the credentials bound to the destination, Rego included."""
        started = time.perf_counter()
        try:
            return await decide(
                self.policy,
                identity,
                request,
                self.resolver,
                self.guard,
                address=address,
                engine=self.engine,
                grants=self.grants,
                reserved=self.reserved.name if self.reserved is not None else None,
                bindings=self.broker,
            )
        finally:
            METRICS.decision_seconds(time.perf_counter() - started)

    def with_credentials(
        self, decision: Decision, identity: Identity | None, host: str, port: int
    ) -> Decision:
        """The decision, intercepting when a credential of the tenant is bound to host:port."""
        return credential_interception(decision, self.broker, identity, host, port)
