"""The end of a guest's proposal in the audit trail: approved, denied or expired.

A held request's end is recorded by the gate that held it (sandgate.proxy.approvals.holds). A
proposal (sandgate.proxy.approvals.endpoint) holds nobody: without this, the trail showed its
`ask` and, when approved with a grant, the grant, but never a denial or an expiry. `opened()`
keeps what the `ask` record said (who asked, from where, for what); when the store closes the
proposal, one record follows with the same fields, the outcome's reason and `approval`
(`id`, `by`, `waited_seconds`), as a held request's end record has. A sweep ends the proposals
past their deadline every SWEEP_SECONDS, so an expiry is recorded when it happens.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import structlog

from sandgate.policy.decision import Decision
from sandgate.policy.reasons import Reason
from sandgate.proxy.approvals.store import AccessRequest, Approvals, State
from sandgate.proxy.audit.records import DecisionContext, decision_record, new_decision_id
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.tasks import BackgroundTask

__all__ = ["SWEEP_SECONDS", "ProposalTrail"]

log = structlog.get_logger("sandgate.approvals")

SWEEP_SECONDS = 1.0

_ENDS: dict[State, tuple[Reason, str]] = {
    State.DENIED: (Reason.APPROVAL_DENIED, "an operator denied this proposal"),
    State.EXPIRED: (Reason.APPROVAL_TIMEOUT, "no decision in time"),
}


class ProposalTrail:
    """Records each proposal's end, and sweeps the store for the ones past their deadline."""

    def __init__(self, ctx: GatewayContext, approvals: Approvals) -> None:
        self.ctx = ctx
        self.approvals = approvals
        # proposal id → the context and decision its `ask` record was written with
        self._asked: dict[str, tuple[DecisionContext, Decision]] = {}
        self._sweeper = BackgroundTask("sandgate-proposal-sweep", self._sweep_loop)
        approvals.on_closed.append(self.closed)

    def start(self) -> None:
        self._sweeper.start()

    async def stop(self) -> None:
        await self._sweeper.stop()

    def opened(self, request: AccessRequest, dctx: DecisionContext, asked: Decision) -> None:
        """The proposal's `ask` record is written: its end will be recorded alike."""
        if request.state is State.PENDING:
            self._asked[request.id] = (dctx, asked)

    def forget(self, request_id: str) -> None:
        """Its `ask` could not be recorded: its end is not recorded either."""
        self._asked.pop(request_id, None)

    def closed(self, request: AccessRequest) -> None:
        """The store ended a request: record it when it is a proposal this worker opened."""
        found = self._asked.pop(request.id, None)
        if found is None:
            return  # a held request (the Gate records its end), or one whose ask was never recorded
        dctx, asked = found
        approval = (request.id, request.by)
        if request.state is State.APPROVED:
            end = replace(asked, allowed=True, ask=False, reason=Reason.ALLOWED, detail="proposal approved")
        else:
            reason, detail = _ENDS.get(request.state, (Reason.APPROVAL_DENIED, request.state.value))
            end = asked.as_denial(reason, detail)
        end = replace(end, approval=approval)
        record = decision_record(replace(dctx, decision_id=new_decision_id(), waited=request.waited), end)
        record["proposal"] = request.proposed()
        # Never waits: the store closes requests inside admin calls and sweeps.
        self.ctx.audit.emit_nowait(record)
        log.info("approval.proposal_ended", id=request.id, state=request.state.value, by=request.by)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                self.approvals.expire()
            except Exception:
                log.exception("approval.sweep_failed")
