"""The `flow.metadata` keys sandgate's addons pass a request's facts through, and who sets each."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "APPROVAL_KEY",
    "CREDENTIALS_KEY",
    "FAILURE_KEY",
    "HEAD_BYTES_KEY",
    "PENDING_KEY",
    "STREAMED_BYTES_KEY",
    "StreamedBytes",
]

# Set by the Gate on an allowed request: (DecisionContext, Decision), its record still to write.
# Whoever refuses the exchange later pops it and records the denial; else AuditCompletion does.
PENDING_KEY = "sandgate.pending"
# Set by the Gate beside PENDING_KEY: the dial approval it added, (address, port, host before),
# so a later refusal of the same request (a tenant limit) withdraws it again.
APPROVAL_KEY = "sandgate.approval"
# Set by the broker addon: (credential names, injector kinds) used on this request.
CREDENTIALS_KEY = "sandgate.credentials"
# The request line and headers as the guest sent them, in bytes (audit `bytes.up`, byte limits).
HEAD_BYTES_KEY = "sandgate.head_bytes"
# Set by an addon that refused what the upstream answered: the record's `error`.
FAILURE_KEY = "sandgate.failure"
# Set by the HTTP seam on a flow whose body streams: the body bytes it sent each way (a
# streamed message keeps no content for the record to count).
STREAMED_BYTES_KEY = "sandgate.streamed_bytes"


@dataclass(slots=True)
class StreamedBytes:
    """Body bytes streamed to the upstream (`up`) and to the guest (`down`)."""

    up: int = 0
    down: int = 0
