"""mitmproxy's error messages to fixed categories: never a byte of the message survives."""

from __future__ import annotations

import pytest
from mitmproxy.proxy.layers.http._events import ErrorCode

from sandgate.policy.reasons import Reason
from sandgate.proxy.mitm.wire_errors import failure_for, failure_of_text

SECRET = "sk-live-CLASSIFIED-0123456789"

CASES = [
    (
        ErrorCode.GENERIC_SERVER_ERROR,
        f"Cannot parse HTTP response: Invalid header line: b'Bearer {SECRET}'",
        "malformed upstream response",
        Reason.UPSTREAM_PROTOCOL_ERROR,
        502,
    ),
    (
        ErrorCode.GENERIC_SERVER_ERROR,
        f"unexpected server response: b'{SECRET}'",
        "malformed upstream response",
        Reason.UPSTREAM_PROTOCOL_ERROR,
        502,
    ),
    (
        ErrorCode.GENERIC_SERVER_ERROR,
        "server closed connection",
        "upstream closed the connection",
        Reason.UPSTREAM_PROTOCOL_ERROR,
        502,
    ),
    (
        ErrorCode.GENERIC_SERVER_ERROR,
        f"HTTP/2 connection closed: <ConnectionTerminated additional_data:b'{SECRET}'>",
        "malformed upstream response",
        Reason.UPSTREAM_PROTOCOL_ERROR,
        502,
    ),
    (
        ErrorCode.RESPONSE_VALIDATION_FAILED,
        f"Received invalid header name: b'{SECRET}' from server, refusing to "
        "prevent request smuggling attacks. Disable the validate_inbound_headers option to skip this security check.",
        "malformed upstream response",
        Reason.UPSTREAM_PROTOCOL_ERROR,
        502,
    ),
    (
        ErrorCode.CONNECT_FAILED,
        "[Errno 111] Connect call failed ('127.0.0.2', 9)",
        "upstream unreachable",
        Reason.UPSTREAM_UNREACHABLE,
        502,
    ),
    (
        ErrorCode.CONNECT_FAILED,
        "[Errno 110] Connect call failed ('192.0.2.1', 443): timed out",
        "upstream timed out",
        Reason.UPSTREAM_UNREACHABLE,
        504,
    ),
    (
        ErrorCode.CONNECT_FAILED,
        f"TLS handshake failed: certificate for {SECRET}",
        "upstream unreachable",
        Reason.UPSTREAM_UNREACHABLE,
        502,
    ),
    (
        ErrorCode.CONNECT_FAILED,
        "Connection killed: sandgate: rate_limited",
        "sandgate: rate_limited",
        Reason.RATE_LIMITED,
        403,
    ),
    (
        ErrorCode.CONNECT_FAILED,
        f"Connection killed: sandgate: {SECRET}",
        "sandgate: internal_error",
        Reason.INTERNAL_ERROR,
        403,
    ),
    (
        ErrorCode.REQUEST_VALIDATION_FAILED,
        "mitmproxy received an HTTP CONNECT request even though it is not running",
        "invalid request",
        Reason.INVALID_REQUEST,
        400,
    ),
    (
        ErrorCode.DESTINATION_UNKNOWN,
        "HTTP request has no host header, destination unknown.",
        "invalid request",
        Reason.INVALID_REQUEST,
        400,
    ),
    (
        ErrorCode.GENERIC_CLIENT_ERROR,
        f"HTTP/1 protocol error: illegal chunk header: {SECRET}",
        "malformed request body",
        Reason.INVALID_REQUEST,
        400,
    ),
    (ErrorCode.CLIENT_DISCONNECTED, "Client disconnected.", "client disconnected", None, None),
    (ErrorCode.KILL, "killed", "killed", None, None),
]


@pytest.mark.parametrize(
    ("code", "message", "text", "reason", "status"),
    CASES,
    ids=[f"{c[0].name} {c[2]} ({i})" for i, c in enumerate(CASES)],
)
def test_a_protocol_error_becomes_a_fixed_category(
    code: ErrorCode, message: str, text: str, reason: Reason | None, status: int | None
) -> None:
    failure = failure_for(code, message)
    assert (failure.text, failure.reason, failure.status) == (text, reason, status)
    assert SECRET not in failure.text
    # A category read back from flow.error is itself (the audit hook sees only these texts).
    assert failure_of_text(failure.text) == failure


def test_an_unknown_message_becomes_a_generic_category() -> None:
    assert failure_of_text(f"something new: {SECRET}").text == "protocol error"
