"""The approvals' builder (`ask` rules): this worker's pending store, what announces and
auto-approves its requests, the guests' own endpoint at the reserved name, and the grants."""

from __future__ import annotations

from dataclasses import dataclass

from sandgate.policy.model.grants import Grants
from sandgate.proxy.addons.drain import Drainer
from sandgate.proxy.approvals import Approvals
from sandgate.proxy.approvals.auto import AutoApprover, through_admin_api
from sandgate.proxy.approvals.endpoint import AccessEndpoint
from sandgate.proxy.approvals.grants import GrantBook, GrantStore
from sandgate.proxy.approvals.proposal_trail import ProposalTrail
from sandgate.proxy.approvals.reserved import ReservedName
from sandgate.proxy.approvals.webhook import Webhook, webhook_for
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.context import GatewayContext

__all__ = ["ApprovalParts", "build_approvals"]


@dataclass(frozen=True)
class ApprovalParts:
    # Requests held for an operator's decision: this worker's pending store.
    pending: Approvals
    # Announces each held request (None: no webhook configured).
    webhook: Webhook | None
    # The guests' endpoint at the reserved name and the trail of its proposals (None: no name).
    endpoint: AccessEndpoint | None
    proposal_trail: ProposalTrail | None
    # Grants approvals added (for one sandbox; in a fleet also for a tenant), hot on every worker.
    grants: GrantBook


def build_approvals(
    config: GatewayConfig, ctx: GatewayContext, drainer: Drainer, grant_store: GrantStore, gateway_id: str
) -> ApprovalParts:
    """Everything approvals need; reserves the endpoint's name in `ctx` when one is configured.
    ConfigError when the webhook's secret cannot be read."""
    cfg = config.approvals
    pending = Approvals(timeout=cfg.ask_timeout_seconds, max_held=cfg.max_held_per_sandbox)
    # A drain answers held requests at once (503, "cut by shutdown"): no operator is coming.
    drainer.on_drain.append(pending.cut_held)
    # Each worker announces the requests it holds.
    webhook = webhook_for(cfg.webhook, pending, gateway_id=gateway_id, worker=config.worker.index)
    if cfg.auto == "within_ceiling":
        # Requests the operator's ceiling proves harmless are approved without a person, by
        # every worker alike: held ones in its own store, proposals through the gateway's admin
        # API (the lead's socket: a peer's own private socket approves nothing).
        admin = through_admin_api(config.gateway_admin_socket_path)
        approver = AutoApprover(config.ceiling_path, lambda: ctx.policy, pending, admin)
        pending.on_opened.append(approver.opened)
    endpoint, trail = _endpoint(config, ctx, pending)

    def put(grants: Grants) -> None:
        ctx.grants = grants

    grants = GrantBook(
        grant_store,
        put,
        ctx.audit.emit,
        sweep=config.worker.lead,  # the lead sweeps the expired ones
        default_ttl=cfg.grant_ttl_seconds,
        max_ttl=cfg.grant_max_ttl_seconds,
    )
    return ApprovalParts(pending, webhook, endpoint, trail, grants)


def _endpoint(
    config: GatewayConfig, ctx: GatewayContext, pending: Approvals
) -> tuple[AccessEndpoint | None, ProposalTrail | None]:
    """The guests' own endpoint at the reserved name (sandgate.proxy.approvals.reserved)."""
    cfg = config.approvals
    if cfg.endpoint_name is None:
        return None, None
    ctx.reserved = ReservedName(cfg.endpoint_name, cfg.endpoint_address)
    # With several workers a poll may land on one that does not hold the request: it asks the
    # lead's admin socket, which asks every worker.
    lead_admin = None
    if config.admin.enabled and config.worker.count > 1:
        lead_admin = config.gateway_admin_socket_path
    trail = ProposalTrail(ctx, pending)
    endpoint = AccessEndpoint(
        ctx,
        pending,
        ctx.reserved,
        per_minute=cfg.proposals_per_minute,
        lead_admin=lead_admin,
        trail=trail,
    )
    return endpoint, trail
