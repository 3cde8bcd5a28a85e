"""Requests held open for an operator's decision (`ask` rules) and guests' proposals: the pending
store of one worker."""

from sandgate.proxy.approvals.store import (
    AccessRequest,
    Approvals,
    DecideError,
    QueueFull,
    State,
)

__all__ = ["AccessRequest", "Approvals", "DecideError", "QueueFull", "State"]
