"""Requests held open for an operator's decision (`ask` rules) and guests' proposals: the pending
store of one worker."""

from sandgate.proxy.approvals.store import (
    AccessRequest,
    Approvals,
    QueueFull,
    SettleError,
    State,
)

__all__ = ["AccessRequest", "Approvals", "QueueFull", "SettleError", "State"]
