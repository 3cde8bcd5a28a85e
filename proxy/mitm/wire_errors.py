"""Fixed texts for what went wrong on the wire, in place of mitmproxy's messages.

mitmproxy's error messages quote the bytes that offended: a header line (`Invalid header
line: b'Bearer sk-…'`), an upstream's GOAWAY debug data, a buffer it could not parse. An
upstream that reflects an injected secret into a malformed answer would put the secret in the
guest's error page, the audit record's `error` and the log. Only the categories below reach
any of them; a message is classified by mitmproxy's own wording (12.3.x) and its error code,
never copied, and anything unrecognised becomes a generic category.
"""

from __future__ import annotations

from dataclasses import dataclass

from mitmproxy.flow import Error
from mitmproxy.proxy.layers.http._events import ErrorCode

from sandgate.policy.reasons import Reason

__all__ = ["Failure", "failure_for", "failure_of_text"]


@dataclass(frozen=True, slots=True)
class Failure:
    """A category of failure: its fixed text, and the answer it gets (None: close, no answer)."""

    text: str
    reason: Reason | None = None
    status: int | None = None


INVALID_REQUEST = Failure("invalid request", Reason.INVALID_REQUEST, 400)
BAD_REQUEST_BODY = Failure("malformed request body", Reason.INVALID_REQUEST, 400)
CLIENT_GONE = Failure("client disconnected")
KILLED = Failure("killed")
TUNNEL_CLOSED = Failure("tunnel closed")
STREAM_RESET = Failure("stream reset")
UNREACHABLE = Failure("upstream unreachable", Reason.UPSTREAM_UNREACHABLE, 502)
TIMED_OUT = Failure("upstream timed out", Reason.UPSTREAM_UNREACHABLE, 504)
MALFORMED = Failure("malformed upstream response", Reason.UPSTREAM_PROTOCOL_ERROR, 502)
UPSTREAM_CLOSED = Failure("upstream closed the connection", Reason.UPSTREAM_PROTOCOL_ERROR, 502)
TOO_LARGE = Failure("body over the size limit", Reason.BODY_TOO_LARGE, 413)
UNKNOWN = Failure("protocol error")
# sandgate.proxy.addons.trailers' own fixed text (a request with HTTP/1 trailers is cut).
TRAILERS = Failure("HTTP/1 trailers cannot be relayed")

_FIXED = {
    f.text: f
    for f in (
        INVALID_REQUEST,
        BAD_REQUEST_BODY,
        CLIENT_GONE,
        KILLED,
        TUNNEL_CLOSED,
        STREAM_RESET,
        UNREACHABLE,
        TIMED_OUT,
        MALFORMED,
        UPSTREAM_CLOSED,
        TOO_LARGE,
        UNKNOWN,
        TRAILERS,
    )
}
_SANDGATE = "sandgate: "
# mitmproxy 12.3 wording of errors about what the guest sent (before any hook decided).
_REQUEST_PREFIXES = (
    "Invalid request scheme",
    "mitmproxy received an HTTP CONNECT",
    "HTTP request has no host header",
    "Bad HTTP request line",
    "Invalid header",
    "Invalid HTTP/2 request headers",
)


def _sandgate_refusal(message: str) -> Failure | None:
    """sandgate's own refusal text (`server_connect`, `client_connected`), kept: it is fixed."""
    _, sep, rest = message.partition(_SANDGATE)
    if not sep:
        return None
    try:
        reason = Reason(rest.strip())
    except ValueError:
        reason = Reason.INTERNAL_ERROR
    return Failure(_SANDGATE + reason.value, reason, 403)


def _connect_failure(message: str) -> Failure:
    refusal = _sandgate_refusal(message)
    if refusal is not None:
        return refusal
    lowered = message.lower()
    return TIMED_OUT if "timed out" in lowered or "timeout" in lowered else UNREACHABLE


def failure_of_text(message: str) -> Failure:
    """The category of a flow error message whose origin (code, side) is unknown."""
    fixed = _FIXED.get(message)
    if fixed is not None:
        return fixed
    refusal = _sandgate_refusal(message)
    if refusal is not None:
        return refusal
    if message in (Error.KILLED_MESSAGE, "killed"):
        return KILLED
    if message.startswith("Client disconnected"):
        return CLIENT_GONE
    if message.startswith("Received ") and message.endswith("skip this security check."):
        # mitmproxy's smuggling check: "Received <what> from client|server, refusing ..."
        return MALFORMED if " from server, refusing" in message else INVALID_REQUEST
    if message.startswith(_REQUEST_PREFIXES):
        return INVALID_REQUEST
    if message.startswith(("Request body exceeds", "Response body exceeds")):
        return TOO_LARGE
    if message.startswith("server closed connection"):
        return UPSTREAM_CLOSED
    if message.startswith(("Cannot parse HTTP response", "unexpected server response")):
        return MALFORMED
    return UNKNOWN


def failure_for(code: ErrorCode, message: str) -> Failure:
    """The category of one of mitmproxy's protocol error events (its code says which side)."""
    fixed = _FIXED.get(message)
    if fixed is not None and fixed.reason is None and code is not ErrorCode.CONNECT_FAILED:
        return fixed  # a text sandgate wrote itself (trailers refused, a category already)
    match code:
        case ErrorCode.KILL:
            return KILLED
        case ErrorCode.CLIENT_DISCONNECTED | ErrorCode.CANCEL:
            return CLIENT_GONE if code is ErrorCode.CLIENT_DISCONNECTED else STREAM_RESET
        case ErrorCode.PASSTHROUGH_CLOSE:
            return TUNNEL_CLOSED
        case ErrorCode.HTTP_1_1_REQUIRED:
            return STREAM_RESET
        case ErrorCode.CONNECT_FAILED:
            return _connect_failure(message)
        case ErrorCode.REQUEST_TOO_LARGE:
            return TOO_LARGE
        case ErrorCode.RESPONSE_TOO_LARGE:
            return MALFORMED
        case (
            ErrorCode.GENERIC_CLIENT_ERROR
            | ErrorCode.REQUEST_VALIDATION_FAILED
            | ErrorCode.DESTINATION_UNKNOWN
        ):
            found = failure_of_text(message)
            if found.reason is Reason.INVALID_REQUEST or found in (CLIENT_GONE, KILLED, STREAM_RESET):
                return found
            if message.startswith(("stream reset", "HTTP/2 connection closed")):
                return STREAM_RESET
            return BAD_REQUEST_BODY
        case ErrorCode.GENERIC_SERVER_ERROR | ErrorCode.RESPONSE_VALIDATION_FAILED:
            found = failure_of_text(message)
            if found.reason in (Reason.UPSTREAM_PROTOCOL_ERROR, Reason.UPSTREAM_UNREACHABLE):
                return found
            if found.reason is not None and found.text.startswith(_SANDGATE):
                return found
            return MALFORMED
