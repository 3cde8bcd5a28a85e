"""Automatic approval (`approvals.auto: within_ceiling`): an access request whose grant would
add nothing outside the operator's ceiling, and touch neither its always-human entries nor a
host a tenant's credentials are bound to, is approved without a person
(sandgate.policy.ceiling.auto decides; every other request waits, as without it).

A held request is approved `once` (released), a guest's proposal with scope `sandbox` (a grant
with the default TTL), both `by: auto:within_ceiling`: the same approval an operator's would
be, through the gateway's admin API (the lead writes grants and reaches the worker holding
the request), so the audit chain, the grants and the webhook are the same too.

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
from sandgate.proxy.approvals.store import AccessRequest, asked_for
from sandgate.proxy.tasks import spawn

__all__ = ["AUTO_BY", "AutoApprover", "through_admin_api"]

log = structlog.get_logger("sandgate.approvals")

AUTO_BY = "auto:within_ceiling"

# Approve one request: (id, scope, reason); raises when the approval did not go through.
Approve = Callable[[str, str, str], Awaitable[None]]


class AutoApprover:
    """An `Approvals.on_opened` listener approving what the ceiling proves harmless."""

    def __init__(self, ceiling_path: Path, policy: Callable[[], PolicySet], approve: Approve) -> None:
        self.ceiling_path = ceiling_path
        self.policy = policy
        self.approve = approve
        self._ceiling: Ceiling | None = None
        self._stamp: tuple[int, int] | None = None
        self.approved = 0
        self.declined = 0

    def opened(self, request: AccessRequest) -> None:
        """Decide now (pure); approve off the store's call, once the request's `ask` is recorded."""
        try:
            why = self.verdict(request)
        except Exception:
            log.exception("approval.auto_failed", id=request.id)
            why = "automatic approval failed"
        if why is not None:
            self.declined += 1
            log.info("approval.auto_declined", id=request.id, sandbox=request.sandbox, why=why)
            return
        scope = "sandbox" if request.kind == "proposal" else "once"
        spawn(self._approve(request, scope), name=f"auto-approve-{request.id}")

    def verdict(self, request: AccessRequest) -> str | None:
        """Why `request` waits for a person, or None: approve it."""
        ceiling = self._load()
        if ceiling is None:
            return f"the ceiling {self.ceiling_path} does not load"
        tenant = self.policy().tenant(request.tenant)
        if tenant is None:
            return "its tenant is not loaded"
        bound = [h for c in tenant.credentials for h in getattr(c, "hosts", ())]
        methods, paths = asked_for(request.view())
        return needs_a_person(asked_shape(request.host, request.port, methods, paths), ceiling, bound)

    async def _approve(self, request: AccessRequest, scope: str) -> None:
        try:
            await self.approve(request.id, scope, f"within the ceiling {self.ceiling_path}")
        except Exception as e:
            # Not approved: it waits for a person, as any other.
            log.warning("approval.auto_not_applied", id=request.id, error=str(e) or type(e).__name__)
            return
        self.approved += 1
        log.info("approval.auto_approved", id=request.id, sandbox=request.sandbox, scope=scope)

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
    """Approvals sent to the gateway's admin API on its unix socket (the lead answers it)."""

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
