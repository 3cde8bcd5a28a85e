"""Automatic approval (`approvals.auto: within_ceiling`): an access request whose grant would
add nothing outside the operator's ceiling, and touch neither its always-human entries nor a
host a tenant's credentials are bound to, is approved without a person
(sandgate.policy.ceiling.auto decides; every other request waits, as without it).

A held request is approved `once` (released), a guest's proposal with scope `sandbox` (a grant
with the default TTL), both `by: auto:within_ceiling`, by the worker that holds it, whichever
it is, and as an operator's approval would be:
- a held request in the worker's own pending store, as the admin API approves `once` on the
  worker holding it (nothing else changes): no other process is needed to release it;
- a proposal through the gateway's admin API, on the lead's socket (never a worker's private
  one, which approves nothing): the lead writes the grant, puts it in force on every worker,
  then takes the approval to the worker holding the proposal.
So the audit chain, the grants and the webhook are an operator's approval's on every worker.
A held MCP tool call (an `mcp.tools.ask` glob) is never approved automatically: the ceiling
says nothing about tools or arguments, so nothing in it can prove one harmless.

The ceiling file is read when it changes (its mtime, looked at per access request: rare);
one that does not load approves nothing (logged) until it is fixed.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import structlog

from sandgate.policy.ceiling import Ceiling, load_ceiling
from sandgate.policy.ceiling.auto import asked_shape, needs_a_person
from sandgate.policy.model.policyset import PolicySet
from sandgate.proxy.approvals.store import AccessRequest, Approvals, asked_for
from sandgate.proxy.metrics import METRICS
from sandgate.proxy.tasks import spawn

__all__ = ["AUTO_BY", "AutoApprover", "through_admin_api"]

log = structlog.get_logger("sandgate.approvals")

AUTO_BY = "auto:within_ceiling"

# Approve one request: (id, scope, reason); raises when the approval did not go through.
Approve = Callable[[str, str, str], Awaitable[None]]


class AutoApprover:
    """An `Approvals.on_opened` listener approving what the ceiling proves harmless.

    `approvals`: this worker's pending store (it releases held requests there); `grant`:
    approves a proposal with scope `sandbox` through the gateway's admin API."""

    def __init__(
        self, ceiling_path: Path, policy: Callable[[], PolicySet], approvals: Approvals, grant: Approve
    ) -> None:
        self.ceiling_path = ceiling_path
        self.policy = policy
        self.approvals = approvals
        self.grant = grant
        self._ceiling: Ceiling | None = None
        self._stamp: tuple[int, int] | None = None

    def opened(self, request: AccessRequest) -> None:
        """Decide now (pure); approve off the store's call, once the request's `ask` is recorded."""
        try:
            why = self.verdict(request)
        except Exception:
            log.exception("approval.auto_failed", id=request.id)
            why = "automatic approval failed"
        if why is not None:
            METRICS.approval_auto("declined")
            log.info("approval.auto_declined", id=request.id, sandbox=request.sandbox, why=why)
            return
        reason = f"within the ceiling {self.ceiling_path}"
        if request.kind == "proposal":
            approve = self._grant(request, reason)
        else:
            approve = self._release(request, reason)
        spawn(approve, name=f"auto-approve-{request.id}")

    def verdict(self, request: AccessRequest) -> str | None:
        """Why `request` waits for a person, or None: approve it."""
        if request.calls:
            # The ceiling bounds hosts, ports, methods and paths; it says nothing about tools or
            # their arguments, so it cannot prove a tool call harmless.
            return "a tool call: the ceiling names no tools, a person decides"
        ceiling = self._load()
        if ceiling is None:
            return f"the ceiling {self.ceiling_path} does not load"
        tenant = self.policy().tenant(request.tenant)
        if tenant is None:
            return "its tenant is not loaded"
        bound = [h for c in tenant.credentials for h in getattr(c, "hosts", ())]
        methods, paths = asked_for(request.view())
        return needs_a_person(asked_shape(request.host, request.port, methods, paths), ceiling, bound)

    async def _release(self, request: AccessRequest, reason: str) -> None:
        """A held request, approved `once` in this worker's own store (the one holding it)."""
        try:
            self.approvals.settle(request.id, approve=True, by=AUTO_BY, reason=reason)
        except Exception as e:
            # Decided or gone meanwhile (an operator was quicker, the client hung up and it
            # expired): nothing is released by this.
            self._not_applied(request, e)
            return
        self._approved(request, "once")

    async def _grant(self, request: AccessRequest, reason: str) -> None:
        """A proposal, approved with scope `sandbox` through the gateway's admin API."""
        try:
            await self.grant(request.id, "sandbox", reason)
        except Exception as e:
            self._not_applied(request, e)
            return
        self._approved(request, "sandbox")

    def _approved(self, request: AccessRequest, scope: str) -> None:
        METRICS.approval_auto("approved")
        log.info("approval.auto_approved", id=request.id, sandbox=request.sandbox, scope=scope)

    def _not_applied(self, request: AccessRequest, error: Exception) -> None:
        # Not approved: it waits for a person, as any other.
        METRICS.approval_auto("not_applied")
        log.warning("approval.auto_not_applied", id=request.id, error=str(error) or type(error).__name__)

    def _load(self) -> Ceiling | None:
        try:
            st = os.stat(self.ceiling_path)
        except OSError as e:
            if self._stamp != (0, 0):
                log.error("approval.ceiling_unreadable", file=str(self.ceiling_path), error=e.strerror)
            self._ceiling, self._stamp = None, (0, 0)
            return None
        stamp = (st.st_ino, st.st_mtime_ns)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._ceiling = load_ceiling(self.ceiling_path)
            except Exception as e:
                # Whatever the file's fault: nothing is approved automatically until it loads.
                self._ceiling = None
                log.error("approval.ceiling_invalid", file=str(self.ceiling_path), error=str(e))
        return self._ceiling


def through_admin_api(socket: Path, timeout: float = 15.0) -> Approve:
    """Approvals sent to the gateway's admin API on its unix socket (the lead's: every worker
    passes the same one, GatewayConfig.gateway_admin_socket_path)."""

    async def approve(request_id: str, scope: str, reason: str) -> None:
        transport = httpx.AsyncHTTPTransport(uds=str(socket))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://sandgate", timeout=timeout
        ) as client:
            answer = await client.post(
                f"/v1/access-requests/{request_id}/approve",
                json={"scope": scope, "by": AUTO_BY, "reason": reason},
            )
        if answer.status_code != 200:
            raise RuntimeError(f"the admin API answered {answer.status_code}: {answer.text[:200]}")

    return approve
