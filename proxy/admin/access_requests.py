"""The access requests the gateway holds (`ask` rules), for the admin API: each worker holds its
own; the lead answers for the gateway, merging its peers' lists and taking an operator's
approval or denial to the worker that holds the request (proxy/admin/peers.py).

What an approval means (its scope, the grant it writes, when peers are told) is decided in
proxy/approvals/operator_decisions.py; this module gives it the workers (`AdminWorkers`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from sandgate.proxy.admin.peers import READ_TIMEOUT, WRITE_TIMEOUT
from sandgate.proxy.admin.state import AdminState
from sandgate.proxy.approvals import SettleError
from sandgate.proxy.approvals.fleet_inbox import FleetUnreachable
from sandgate.proxy.approvals.operator_decisions import OperatorDesk, Reload

__all__ = [
    "GRANTS_REFRESH_PATH",
    "INTERNAL_PATH",
    "AdminWorkers",
    "desk",
    "gateway_requests",
    "list_requests",
    "refresh_peers",
    "settle_request",
    "show_request",
]

log = structlog.get_logger("sandgate.admin")

# A peer's own access requests (served on its private socket only).
INTERNAL_PATH = "/internal/v1/access-requests"
# A peer puts the gateway's grants store in force again at once (the lead changed it).
GRANTS_REFRESH_PATH = "/internal/v1/grants/refresh"


def _local(state: AdminState) -> list[dict[str, Any]]:
    if state.approvals is None:
        return []
    return [{**r.view(), "worker": state.role.index} for r in state.approvals.listing()]


async def list_requests(state: AdminState) -> dict[str, Any]:
    """The open access requests of every worker (oldest first), and the workers that did not
    answer; in a fleet also the other gateways' (each with its `gateway`), and `fleet`: whether
    they could be read."""
    out = await gateway_requests(state)
    inbox = state.fleet_inbox
    if inbox is None:
        return out
    for r in out["requests"]:
        r.setdefault("gateway", state.gateway_id)
    try:
        others = await inbox.others()
    except FleetUnreachable:
        error = "the fleet's redis is unreachable: only this gateway's held requests are listed"
        out.setdefault("unanswered", []).append({"fleet": True, "error": error})
        out["fleet"] = {"reachable": False, "error": error}
        return out
    # One held here is listed once, from here (a stale copy in redis is not).
    here = {str(r.get("id")) for r in out["requests"]}
    out["requests"].extend(r for r in others if str(r.get("id")) not in here)
    out["requests"].sort(key=lambda r: str(r.get("id")))
    out["fleet"] = {"reachable": True}
    return out


async def gateway_requests(state: AdminState) -> dict[str, Any]:
    """The open access requests of this gateway's workers (what it publishes to its fleet)."""
    requests = _local(state)
    unanswered: list[dict[str, Any]] = []
    if state.peers is not None:
        for a in await state.peers.call("GET", INTERNAL_PATH, within=READ_TIMEOUT):
            listed = a.body.get("requests")
            if a.ok and isinstance(listed, list):
                requests.extend(r for r in listed if isinstance(r, dict))
            else:
                unanswered.append(a.view())
    requests.sort(key=lambda r: str(r.get("id")))
    out: dict[str, Any] = {"requests": requests}
    if unanswered:
        out["unanswered"] = unanswered
    return out


async def show_request(state: AdminState, request_id: str, *, fleet: bool = True) -> dict[str, Any] | None:
    """One access request, from whichever worker holds (or held) it (`fleet`: or another
    gateway of the fleet); None when none does."""
    if state.approvals is not None:
        found = state.approvals.get(request_id)
        if found is not None:
            return {**found.view(), "worker": state.role.index}
    if state.peers is not None:
        for a in await state.peers.call("GET", f"{INTERNAL_PATH}/{request_id}", within=READ_TIMEOUT):
            if a.ok:
                return a.body
    if fleet and state.fleet_inbox is not None:
        # Another gateway's, as the fleet's listing shows it (None when redis is unreachable).
        try:
            return next((r for r in await state.fleet_inbox.others() if r.get("id") == request_id), None)
        except FleetUnreachable:
            return None
    return None


async def settle_request(
    state: AdminState, request_id: str, *, approve: bool, by: str | None, reason: str | None
) -> dict[str, Any]:
    """Approve or deny a request on the worker that holds it; SettleError 404 / 409 (or 503
    when a worker that may hold it did not answer)."""
    if state.approvals is not None:
        try:
            settled = state.approvals.settle(request_id, approve=approve, by=by, reason=reason)
            return {**settled.view(), "worker": state.role.index}
        except SettleError as e:
            if e.status != 404 or state.peers is None:
                raise
    if state.peers is None:
        raise SettleError(404, f"no access request {request_id!r}")
    verb = "approve" if approve else "deny"
    answers = await state.peers.call(
        "POST",
        f"{INTERNAL_PATH}/{request_id}/{verb}",
        within=WRITE_TIMEOUT,
        json={"by": by, "reason": reason},
    )
    for a in answers:
        if a.ok:
            return a.body
        if a.status == 409:
            raise SettleError(
                409, str(a.body.get("error") or f"access request {request_id!r} is already decided")
            )
    if any(a.status != 404 for a in answers):
        missing = "; ".join(a.error or f"worker {a.index}" for a in answers if a.status != 404)
        raise SettleError(503, f"no worker that answered holds {request_id!r}; not answered: {missing}")
    raise SettleError(404, f"no access request {request_id!r}")


async def refresh_peers(state: AdminState) -> None:
    """Every peer reads the grants store again now (each also looks twice a second)."""
    if state.peers is None:
        return
    answers = await state.peers.call("POST", GRANTS_REFRESH_PATH, within=WRITE_TIMEOUT)
    missing = [a.error or f"worker {a.index}" for a in answers if not a.ok]
    if missing:
        log.warning("grants.refresh_not_confirmed", workers="; ".join(missing))


@dataclass(frozen=True, slots=True)
class AdminWorkers:
    """The gateway's workers, reached through this worker's admin state (and its peers on the lead)."""

    state: AdminState

    async def find(self, request_id: str) -> dict[str, Any] | None:
        # This gateway's only: another gateway's request is decided there, whole.
        return await show_request(self.state, request_id, fleet=False)

    async def settle(
        self, request_id: str, *, approve: bool, by: str | None, reason: str | None
    ) -> dict[str, Any]:
        return await settle_request(self.state, request_id, approve=approve, by=by, reason=reason)

    async def refresh_grants(self) -> None:
        await refresh_peers(self.state)


def desk(state: AdminState, reload: Reload) -> OperatorDesk:
    """What an operator's decision through this admin API acts on."""
    return OperatorDesk(workers=AdminWorkers(state), grants=state.grants, ctx=state.ctx, reload=reload)
