"""What a tunnel must pass, as plain functions both mitmproxy's addons and the passthrough front
call (neither decides it a second way): its ClientHello's SNI must fit the CONNECT, and its
tenant's limits count it as a request when it is dialled and its bytes as they pass.
"""

from __future__ import annotations

from sandgate.policy.decide import literal_ip
from sandgate.policy.decision import Decision, Identity, Phase
from sandgate.policy.errors import HostError
from sandgate.policy.hosts import normalise_host
from sandgate.policy.limiter import LimitExceeded
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.model.tenant import Limits
from sandgate.policy.reasons import Reason
from sandgate.proxy.audit.records import DecisionContext, decision_record
from sandgate.proxy.context import ConnectionState, GatewayContext

__all__ = [
    "admit_tunnel",
    "count_tunnel_bytes",
    "is_tunnel",
    "limit_decision",
    "sni_problem",
    "tenant_limits",
    "tls_decision",
    "tunnel_base",
    "tunnel_context",
]


def tls_decision(sni: str | None, host: str | None, decision: Decision, *, require_sni: bool) -> Decision:
    """The decision on a tunnel's ClientHello: the tunnel's own, or `sni_mismatch` when the SNI
    does not fit it (see `sni_problem`)."""
    problem = sni_problem(sni, host, decision, require_sni=require_sni)
    if problem is None:
        return decision
    return Decision(
        reason=Reason.SNI_MISMATCH,
        policy_version=decision.policy_version,
        mode=decision.mode,
        address=decision.address,
        detail=problem,
    )


def sni_problem(sni: str | None, host: str | None, decision: Decision, *, require_sni: bool) -> str | None:
    """Why a ClientHello's SNI does not fit the tunnel, or None.

    A present SNI must name the CONNECT host (compared normalised: case, trailing dot). An
    absent one is accepted where the gateway sees every request anyway (intercepted), where
    a network rule allowed the address (a tunnel to an IP literal, any SNI will do), and on
    `protocol: tcp` tunnels (any bytes may pass). A passthrough tunnel to a name needs one:
    without it the server picks a default site and routes by the inner Host, which the
    gateway cannot see (domain fronting), unless the operator admits such clients.
    """
    if host is None:
        return "no tunnel host"
    if literal_ip(host) is not None:
        return None
    if sni is None:
        passthrough = not decision.inspect and not decision.raw_tcp
        return "no SNI on a passthrough tunnel" if passthrough and require_sni else None
    try:
        return None if normalise_host(sni) == host else "SNI does not name the CONNECT host"
    except HostError:
        return "SNI is not a host name"


def is_tunnel(state: ConnectionState) -> bool:
    """Whether the connection's bytes pass without HTTP requests to see (passthrough or raw TCP)."""
    return (
        state.passthrough
        or state.raw
        or (state.tunnel_decision is not None and state.tunnel_decision.raw_tcp)
    )


async def admit_tunnel(ctx: GatewayContext, state: ConnectionState) -> LimitExceeded | None:
    """A passthrough or raw tunnel counts as one request at its upstream connect; over a limit
    it is refused: the connection is marked refused and the denial recorded (returned)."""
    limits = tenant_limits(ctx.policy, state.identity)
    if state.identity is None or limits is None:
        return None
    learn = ctx.limit_learn
    if learn is not None:
        # Fleet mode: a sandbox new to this gateway waits for one sync (as TenantLimits does).
        await learn(state.identity.tenant, state.identity.sandbox, limits)
    exceeded = ctx.limiter.admit(state.identity.tenant, state.identity.sandbox, limits)
    if exceeded is None:
        return None
    state.refused(exceeded.reason)
    await ctx.audit.emit(
        decision_record(tunnel_context(state), limit_decision(tunnel_base(ctx, state), exceeded))
    )
    return exceeded


def count_tunnel_bytes(ctx: GatewayContext, state: ConnectionState | None, nbytes: int) -> bool:
    """Count bytes a guest sent into a passed-through tunnel (no flow, no hook: the front's
    splice and mitmproxy's ignored TCP layer call this per chunk); False: cut the tunnel, it
    passed a byte limit (its denial queued, once) or was refused before."""
    if state is None or state.denied is not None:
        return False  # refused before, or (never expected) not a connection sandgate admitted
    identity = state.identity
    limits = tenant_limits(ctx.policy, identity)
    if identity is None or limits is None:
        return True
    exceeded = ctx.limiter.add_egress(identity.tenant, identity.sandbox, limits, nbytes)
    if exceeded is None:
        return True
    state.refused(exceeded.reason)
    denial = limit_decision(tunnel_base(ctx, state), exceeded, within="in a passthrough tunnel")
    # Not awaited: a relay has no hook to wait in; the record takes a place over the bound.
    ctx.audit.emit_nowait(decision_record(tunnel_context(state), denial))
    return False


def tunnel_context(state: ConnectionState) -> DecisionContext:
    """A tunnel's decision context: its CONNECT target (for a transparent raw tunnel, which has
    none, the original destination) and SNI."""
    dst_host, dst_port = state.original_dst or (None, None)
    return DecisionContext(
        phase=Phase.CONNECT,
        listener=state.listener,
        client=state.client,
        host=state.tunnel_host or dst_host,
        port=state.tunnel_port or dst_port,
        sni=state.sni,
        identity=state.identity,
    )


def tunnel_base(ctx: GatewayContext, state: ConnectionState) -> Decision:
    """The decision a tunnel's later denial keeps the rule and version of."""
    return state.tunnel_decision or Decision(policy_version=ctx.policy.version)


def tenant_limits(policy: PolicySet, identity: Identity | None) -> Limits | None:
    """The limits of the identity's tenant, or None (no identity, no tenant, no limits)."""
    if identity is None:
        return None
    tenant = policy.tenant(identity.tenant)
    return tenant.limits if tenant is not None else None


def limit_decision(decision: Decision, exceeded: LimitExceeded, *, within: str | None = None) -> Decision:
    """The denial recorded for a limit (`within`: where it was passed, for the detail), keeping
    the allowing decision's rule and version."""
    return decision.as_denial(exceeded.reason, exceeded.limit + (f" ({within})" if within else ""))
