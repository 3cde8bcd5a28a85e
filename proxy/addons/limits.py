"""The mitmproxy side of tenant limits: what a request sends upstream, and a metering body stream.

The Gate asks the context's Limiter (sandgate.policy.limiter) at each HTTP request and at
each new passthrough or raw tunnel; this module turns flows into the numbers it counts.
Egress bytes of an HTTP request: its request line, headers and body as the guest sent them.
"""

from __future__ import annotations

from collections.abc import Callable

from mitmproxy import http

from sandgate.policy.decision import Identity
from sandgate.policy.limiter import Limiter, LimitExceeded
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.model.tenant import Limits
from sandgate.policy.reasons import Reason

__all__ = [
    "LimitStreamCut",
    "body_length_unknown",
    "body_meter",
    "declared_length",
    "head_bytes",
    "tenant_limits",
]


class LimitStreamCut(Exception):
    """Raised from a request body stream to abort it: a body or byte limit was passed."""


def tenant_limits(policy: PolicySet, identity: Identity | None) -> Limits | None:
    """The limits of the identity's tenant, or None (no identity, no tenant, no limits)."""
    if identity is None:
        return None
    tenant = policy.tenant(identity.tenant)
    return tenant.limits if tenant is not None else None


def head_bytes(request: http.Request) -> int:
    """Bytes of the request line and headers as HTTP/1.1 would send them (CRLFs included)."""
    size = len(request.method) + len(request.path) + len(request.http_version) + 4
    for name, value in request.headers.fields:
        size += len(name) + len(value) + 4
    return size + 2


def declared_length(message: http.Message) -> int | None:
    """The Content-Length of a request or response, or None when absent or unparseable."""
    try:
        length = message.headers.get("content-length")
        return int(length) if length is not None else None
    except ValueError:
        return None


def body_length_unknown(request: http.Request) -> bool:
    """Whether a body of unknown length follows (chunked, or HTTP/2 without Content-Length)."""
    if declared_length(request) is not None:
        return False
    if "chunked" in request.headers.get("transfer-encoding", "").lower():
        return True
    return not request.http_version.startswith("HTTP/1")


def body_meter(
    limiter: Limiter,
    identity: Identity,
    limits: Limits,
    on_exceeded: Callable[[LimitExceeded], None],
) -> Callable[[bytes], bytes]:
    """A request body stream that counts egress and stops at the body or byte limit.

    The chunk that would pass a limit is never sent: `on_exceeded` (audit, kill) runs and the
    stream raises, which aborts the message so the upstream never sees a complete request.
    """
    seen = 0

    def meter(chunk: bytes) -> bytes:
        nonlocal seen
        seen += len(chunk)
        exceeded: LimitExceeded | None = None
        if limits.request_body_bytes is not None and seen > limits.request_body_bytes:
            exceeded = LimitExceeded(Reason.BODY_TOO_LARGE, "request_body_bytes")
        else:
            exceeded = limiter.add_egress(identity.tenant, identity.sandbox, limits, len(chunk))
        if exceeded is not None:
            on_exceeded(exceeded)
            raise LimitStreamCut(exceeded.limit)
        return chunk

    return meter
