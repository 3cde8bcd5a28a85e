"""What the console reads and does, as a Protocol: the admin server hands in its own
implementation (sandgate.proxy.admin.handlers.AdminActions), so a click runs the same code as
`sandgate requests approve` and the console keeps no second copy of approvals or grants."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["OperatorActions"]


class OperatorActions(Protocol):
    """The admin API's operations the console offers."""

    async def requests(self) -> dict[str, Any]:
        """The open access requests of every worker: `{"requests": [...], "unanswered": [...]}`."""
        ...

    async def status(self) -> dict[str, Any]:
        """What `sandgate status` shows: policy, sandboxes, listeners, reloads, workers, queue."""
        ...

    async def readiness(self) -> dict[str, Any]:
        """What /readyz answers: `{"ready": bool, "checks": {...}}`."""
        ...

    async def decide(self, request_id: str, verb: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Approve or deny (`verb`) with the API's body fields; SettleError or ValueError."""
        ...

    async def grants(self) -> dict[str, Any]:
        """The grants in force, with their uses: `{"grants": [...]}`."""
        ...

    async def revoke(self, grant_id: str, by: str | None) -> dict[str, Any]:
        """Withdraw a grant; SettleError 404 / 503."""
        ...

    async def explain(self, fields: dict[str, str]) -> dict[str, Any]:
        """`policy explain` of the request a record describes, against the policy in force
        (sandgate.proxy.console.explain); ValueError for a record that names no request."""
        ...
