"""Hop-by-hop header fields stay on their hop (RFC 9110 7.6.1), in both directions.

Removed from requests (before they are decided, so Rego sees what is forwarded) and from
responses (before the guest sees them): Keep-Alive, Proxy-Connection, TE (except
`TE: trailers` on HTTP/2, which gRPC needs), Proxy-Authorization, Proxy-Authenticate,
Proxy-Authentication-Info, and every field a Connection header names.

Kept: Connection's own `close`, `keep-alive` and `upgrade` tokens (mitmproxy reads the first
two to manage connections; upgrades are the upgrade check's business), and the fields a
Connection header may not remove: Host, Upgrade, and the framing fields Content-Length and
Transfer-Encoding (dropping one would make the upstream read the body as another request).
"""

from __future__ import annotations

import structlog
from mitmproxy import http

__all__ = ["HopByHop", "strip_hop_by_hop"]

log = structlog.get_logger("sandgate.hopbyhop")

_ALWAYS = frozenset(
    {
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"proxy-authentication-info",
    }
)
_CONNECTION_OWN = frozenset({b"close", b"keep-alive", b"upgrade"})
_NEVER_NAMED = frozenset({b"host", b"upgrade", b"content-length", b"transfer-encoding", b"connection"})


def strip_hop_by_hop(message: http.Message) -> None:
    """Remove the hop-by-hop fields of a request or response, in one pass over its headers."""
    headers = message.headers
    own: list[bytes] = []
    named: set[bytes] = set()
    te_values: list[bytes] = []
    hop = False  # any field this could remove or rewrite at all
    for name, value in headers.fields:
        lowered = name.lower()
        if lowered in _ALWAYS:
            hop = True
        if lowered == b"connection":
            hop = True
            for token in value.split(b","):
                token = token.strip()
                if token.lower() in _CONNECTION_OWN:
                    own.append(token)
                elif token:
                    named.add(token.lower())
        elif lowered == b"te":
            te_values.append(value.strip().lower())
    if not hop:
        return  # most requests and responses: nothing to drop, the fields stay as they are
    drop = (_ALWAYS | named) - _NEVER_NAMED
    if message.http_version in ("HTTP/2.0", "HTTP/3") and all(v == b"trailers" for v in te_values):
        drop = drop - {b"te"}
    fields: list[tuple[bytes, bytes]] = []
    for name, value in headers.fields:
        lowered = name.lower()
        if lowered == b"connection":
            if own:
                # One Connection field, where the first was, with the connection's own tokens.
                fields.append((name, b", ".join(dict.fromkeys(own))))
                own = []
        elif lowered not in drop:
            fields.append((name, value))
    if tuple(fields) != headers.fields:
        headers.fields = tuple(fields)


class HopByHop:
    """Strips hop-by-hop fields from upstream responses (the Gate strips them from requests)."""

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        # A response an addon made (the 407 with its Proxy-Authenticate, a denial) is complete
        # when mitmproxy replays this hook for it; one from upstream has no body read yet.
        if flow.response is None or flow.response.timestamp_end is not None:
            return
        try:
            strip_hop_by_hop(flow.response)
        except Exception:
            # Fail closed: a response we could not clean does not reach the guest.
            log.exception("hook_failed", hook="hopbyhop.responseheaders")
            flow.kill()
