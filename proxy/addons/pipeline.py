"""The addon pipeline: sandgate's addons and mitmproxy's own, in the one order every event
runs through them. The gateway adds `pipeline(...)` to its master; the in-process tests take
a subset of it (`only=`), in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from mitmproxy.addons.next_layer import NextLayer
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.addons.tlsconfig import TlsConfig

from sandgate.proxy.addons.agent_lists import AgentListFilter
from sandgate.proxy.addons.agent_protocols import AgentProtocols
from sandgate.proxy.addons.agent_rego import AgentRego
from sandgate.proxy.addons.agent_websocket import AgentWebsocket
from sandgate.proxy.addons.audit_completion import AuditCompletion
from sandgate.proxy.addons.connection_limits import ConnectionLimits, SandboxConnectionCap
from sandgate.proxy.addons.credential_broker import CredentialBroker
from sandgate.proxy.addons.dial_guard import DialGuard
from sandgate.proxy.addons.drain import DrainEnd, Drainer, DrainStart
from sandgate.proxy.addons.h2_guard import H2Guard
from sandgate.proxy.addons.heads import HeadGuard
from sandgate.proxy.addons.hop_by_hop import HopByHop
from sandgate.proxy.addons.http_seam import HttpErrorSeam
from sandgate.proxy.addons.identify import Identify
from sandgate.proxy.addons.latency import UpstreamTiming
from sandgate.proxy.addons.limits import TenantLimits
from sandgate.proxy.addons.protocol_bodies import bounds_of
from sandgate.proxy.addons.request_gate import RequestGate
from sandgate.proxy.addons.trailers import Trailers
from sandgate.proxy.addons.transparent import Transparent
from sandgate.proxy.addons.tunnel_gate import TunnelGate
from sandgate.proxy.addons.upgrades import Upgrades
from sandgate.proxy.approvals import Approvals
from sandgate.proxy.approvals.endpoint import AccessEndpoint
from sandgate.proxy.approvals.holds import Holds
from sandgate.proxy.config import AgentProtocolsConfig, HeadsConfig, WebSocketConfig
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.mitm.closer import ConnectionCloser

__all__ = ["Shared", "pipeline"]


@dataclass(frozen=True)
class Shared:
    """What the addons share beyond the gateway context, each built once by the gateway. A
    test leaves out what the addons it keeps do not use (defaults: the config's)."""

    server: Proxyserver | None = None
    connection_limits: ConnectionLimits | None = None
    h2_guard: H2Guard | None = None
    drainer: Drainer | None = None
    closer: ConnectionCloser | None = None
    heads: HeadsConfig = field(default_factory=HeadsConfig)
    websocket: WebSocketConfig | None = None
    # How much of a body or message an agent-protocol rule reads (`agent_protocols:`).
    agent_protocols: AgentProtocolsConfig = field(default_factory=AgentProtocolsConfig)
    require_sni: bool = True
    # Holds `ask` decisions; None: they are refused (approval_required).
    approvals: Approvals | None = None
    # Answers requests to the reserved name; None: no name is reserved.
    endpoint: AccessEndpoint | None = None
    # The gateway's own start and stop hooks (an addon), run after every other addon's.
    lifecycle: object | None = None
    # Chooses the lean HTTP/1.1 layer (proxy/lean/, a layer above the addons: it runs their
    # hooks); placed right after the HTTP/2 guard, the last of the layer choosers. None: none.
    lean: object | None = None


def pipeline(ctx: GatewayContext, shared: Shared, *, only: Collection[type] | None = None) -> list[Any]:
    """The addons in pipeline order; `only`: just those of these classes, still in this order.

    Without `only` every addon is built, and a part it needs that `shared` lacks is a TypeError.
    """
    s = shared
    holds = _once(lambda: Holds(ctx, s.approvals))  # one, shared by both gates
    reserved = s.endpoint.reserved if s.endpoint is not None else None
    bounds = bounds_of(s.agent_protocols)
    order: list[tuple[type, Callable[[], Any]]] = [
        (Proxyserver, lambda: _given(s.server, "server")),  # mitmproxy's listeners and connections
        # First: a connection over the caps reaches nothing else.
        (ConnectionLimits, lambda: _given(s.connection_limits, "connection_limits")),
        (Identify, lambda: Identify(ctx)),  # who it is, before anything reads the sandbox
        # The per-sandbox share of the caps: it needs the identity.
        (
            SandboxConnectionCap,
            lambda: SandboxConnectionCap(ctx, _given(s.connection_limits, "connection_limits")),
        ),
        # Before mitmproxy's layer selection: a raw-TCP approval picks the layer.
        (Transparent, lambda: Transparent(ctx)),
        (NextLayer, NextLayer),  # mitmproxy's layer selection
        # Before the HTTP/2 guard: it pre-sets its server on the (guarded) HttpLayer.
        (HttpErrorSeam, lambda: HttpErrorSeam(ctx)),
        (H2Guard, lambda: _given(s.h2_guard, "h2_guard")),  # on the layer just chosen
        (TlsConfig, TlsConfig),  # mitmproxy's TLS: certificates and settings of intercepted connections
        # Before the gates: every request counts as in flight; a new one is refused while draining.
        (DrainStart, lambda: DrainStart(_given(s.drainer, "drainer"))),
        (HeadGuard, lambda: HeadGuard(ctx, s.heads)),  # before the gates: a refused head is recorded once
        # Before the gates: h2c offers are stripped before a request is decided, and a refused
        # answer is in place when the exchange is recorded.
        (Upgrades, lambda: Upgrades(ctx, _given(s.closer, "closer"), s.websocket)),
        (Trailers, lambda: Trailers(_given(s.closer, "closer"))),  # its failure is in the exchange's record
        # The gates, each hook where the one Gate had it: CONNECT, ClientHello, raw TCP (and the
        # end of a connection's holds); each request; every upstream dial.
        (
            TunnelGate,
            lambda: TunnelGate(ctx, holds(), require_sni=s.require_sni, closer=s.closer, reserved=reserved),
        ),
        (RequestGate, lambda: RequestGate(ctx, holds(), endpoint=s.endpoint)),
        (DialGuard, lambda: DialGuard(ctx)),
        # Right after the gates: counts only what they allowed, before the broker wraps a metered body.
        (TenantLimits, lambda: TenantLimits(ctx, s.closer)),
        # What the limits let go, its body read and decided (`mcp:`, `jsonrpc:`) before the broker
        # swaps placeholders in it; its stream holder wraps the limits' body meter.
        (AgentProtocols, lambda: AgentProtocols(ctx, holds(), bounds)),
        # The messages it allowed, asked about by the tenant's Rego (phase "message") before the
        # list filter and the broker; a body of unknown length is refused at its head.
        (AgentRego, lambda: AgentRego(ctx, bounds)),
        # Its list answers filtered, before the broker chains its scrubber behind the stream.
        (AgentListFilter, lambda: AgentListFilter(bounds)),
        # The guest's WebSocket messages on such a rule, decided one by one after Upgrades checked
        # them for placeholders and counted their bytes.
        (AgentWebsocket, lambda: AgentWebsocket(ctx, _given(s.closer, "closer"), bounds)),
        # Completes the allowed exchange's record before the broker scrubs the response it counts.
        (AuditCompletion, lambda: AuditCompletion(ctx)),
        (HopByHop, HopByHop),  # upstream responses lose hop-by-hop fields before the broker scrubs them
        (CredentialBroker, lambda: CredentialBroker(ctx)),  # real credentials on what was allowed
        (UpstreamTiming, UpstreamTiming),  # measures only, never touches the flow
        (DrainEnd, lambda: DrainEnd(_given(s.drainer, "drainer"))),  # after every addon that records
    ]
    if only is not None and (unknown := set(only) - {cls for cls, _ in order}):
        raise TypeError(f"pipeline: not in it: {sorted(c.__name__ for c in unknown)}")
    addons = [make() for cls, make in order if only is None or cls in only]
    if s.lean is not None:
        _insert_after(addons, H2Guard, s.lean)
    if s.lifecycle is not None:
        addons.append(s.lifecycle)  # last: services stop after every addon's `done`
    return addons


def _insert_after(addons: list[Any], cls: type, addon: object) -> None:
    """`addon` right after the instance of `cls` (the end without one). The lean layer's chooser
    comes after the guards made mitmproxy's HTTP layer theirs: it keeps that layer inside for
    the requests it hands over."""
    after = [i for i, a in enumerate(addons) if isinstance(a, cls)]
    addons.insert(after[0] + 1 if after else len(addons), addon)


def _once[T](make: Callable[[], T]) -> Callable[[], T]:
    """`make`, called on first use only: later calls return the same object."""
    made: list[T] = []

    def get() -> T:
        if not made:
            made.append(make())
        return made[0]

    return get


def _given[T](part: T | None, name: str) -> T:
    """A part the pipeline needs; TypeError naming it when `Shared` lacks it."""
    if part is None:
        raise TypeError(f"pipeline: Shared.{name} is needed")
    return part
