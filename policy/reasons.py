"""The one enum of reason codes: the `X-Sandgate-Reason` header, the audit `reason`, Rego results."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Reason"]


class Reason(StrEnum):
    """Why a decision came out as it did. Never reuse a code for another meaning."""

    ALLOWED = "allowed"
    NO_IDENTITY = "no_identity"
    HOST_NOT_ALLOWED = "host_not_allowed"
    HOST_DENIED = "host_denied"
    PORT_NOT_ALLOWED = "port_not_allowed"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    PATH_NOT_ALLOWED = "path_not_allowed"
    PRIVATE_ADDRESS = "private_address"
    DNS_FAILURE = "dns_failure"
    DNS_DENIED = "dns_denied"
    SNI_MISMATCH = "sni_mismatch"
    HOST_MISMATCH = "host_mismatch"
    PROTOCOL_NOT_ALLOWED = "protocol_not_allowed"
    POLICY_DENIED = "policy_denied"
    POLICY_ERROR = "policy_error"
    CREDENTIAL_HOST_MISMATCH = "credential_host_mismatch"
    RATE_LIMITED = "rate_limited"
    BODY_TOO_LARGE = "body_too_large"
    INTERNAL_ERROR = "internal_error"
    # A request line or Host the gateway cannot parse into one unambiguous destination.
    INVALID_REQUEST = "invalid_request"
    # A placeholder-shaped value this gateway did not mint (another gateway's key, a forgery).
    UNKNOWN_PLACEHOLDER = "unknown_placeholder"
    # A request or response head over the size or count cap (431, then the connection closes).
    HEADER_TOO_LARGE = "header_too_large"
    # A request head not read whole within the header-read timeout (408, then the connection closes).
    HEADER_TIMEOUT = "header_timeout"
    # An `Upgrade` (WebSocket, h2c, ...) no rule allows, or an unexpected 101 from upstream.
    UPGRADE_NOT_ALLOWED = "upgrade_not_allowed"
    # An allowed destination that could not be reached (502) or did not answer in time (504).
    UPSTREAM_UNREACHABLE = "upstream_unreachable"
    # A connection over the gateway's caps (per source, per sandbox, fd headroom): closed at connect,
    # or 429 on the explicit proxy once the sandbox is known.
    CONNECTION_LIMIT = "connection_limit"
    # A client abusing a protocol's machinery (HTTP/2 rapid reset): GOAWAY, then the connection closes.
    PROTOCOL_ABUSE = "protocol_abuse"
    # An allowed destination that answered with something that is not valid HTTP, or closed
    # the connection without an answer (502).
    UPSTREAM_PROTOCOL_ERROR = "upstream_protocol_error"
