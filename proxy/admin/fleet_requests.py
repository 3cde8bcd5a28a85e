"""The admin API's side of the fleet's approval inbox: the lead of each gateway publishes the
requests its workers hold, lists the other gateways', and applies the decisions they hand it
(sandgate.proxy.approvals.fleet_inbox carries them through redis).

A handed-over decision is applied by `decide_here`, the function a decision taken on this
gateway's own admin API uses: the same scopes, grants, checks and audit records, with `by` as
the operator gave it; the log line names the gateway it came through."""

from __future__ import annotations

from typing import Any

import structlog
from pydantic import ValidationError

from sandgate.proxy.admin.access_requests import gateway_requests
from sandgate.proxy.admin.handlers import AccessDecision, decide_here, valid_request_id
from sandgate.proxy.admin.state import AdminState
from sandgate.proxy.approvals import SettleError
from sandgate.proxy.approvals.fleet_inbox import FleetInbox
from sandgate.proxy.config import RedisConfig
from sandgate.proxy.redis.client import Keys, connect
from sandgate.proxy.redis.outage import REDIS_OUTAGE

__all__ = ["apply_handed_over", "fleet_inbox_for"]

log = structlog.get_logger("sandgate.admin")


async def apply_handed_over(
    state: AdminState, request_id: str, verb: str, fields: dict[str, Any], via: str
) -> dict[str, Any]:
    """Apply a decision another gateway handed over, for a request held here (SettleError 404
    when none is; 422 for fields this gateway's API would refuse)."""
    if not valid_request_id(request_id):
        raise SettleError(404, f"no access request {request_id[:64]!r}")
    try:
        ask = AccessDecision.model_validate(fields)
    except ValidationError as e:
        err = e.errors(include_url=False, include_input=False)[0]
        raise SettleError(422, f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    settled = await decide_here(state, request_id, verb, ask)
    log.info(
        "admin.access_request_decided", id=request_id, decision=verb, by=ask.by, via="fleet", through=via
    )
    return {**settled, "decided_through": via}


def fleet_inbox_for(state: AdminState, cfg: RedisConfig) -> FleetInbox:
    """The lead's fleet inbox (its own client: its blocking pops hold a connection each), told
    of every request held or settled on this worker."""

    async def listing() -> list[dict[str, Any]]:
        requests: list[dict[str, Any]] = (await gateway_requests(state))["requests"]
        return requests

    async def apply(request_id: str, verb: str, fields: dict[str, Any], via: str) -> dict[str, Any]:
        return await apply_handed_over(state, request_id, verb, fields, via)

    inbox = FleetInbox(
        connect(cfg),
        Keys(cfg.prefix),
        state.gateway_id,
        timeout=cfg.timeout_seconds,
        list_local=listing,
        apply=apply,
        outage=REDIS_OUTAGE,
    )
    if state.approvals is not None:
        state.approvals.on_opened.append(inbox.changed)
        state.approvals.on_closed.append(inbox.settled)
    return inbox
