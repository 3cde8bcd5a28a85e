"""HTTP/1 trailers that mitmproxy's HTTP/1 writer cannot relay: refused at once.

sandgate.proxy.mitm.trailers makes mitmproxy's HTTP/1 reader hand a response's trailers on;
the `Trailers` addon then refuses a response with trailers for an HTTP/1 guest: `502
upstream_unreachable` (the upstream's answer cannot be relayed; an upstream failure, not a
policy denial) and both connections closed; when its body already streamed to the guest, the
guest's connection is cut before the last chunk (an incomplete message, never a complete one
without its trailers). HTTP/2 carries trailers natively (gRPC): an HTTP/2 guest's trailers
pass untouched.
"""

from __future__ import annotations

import structlog
from mitmproxy import http

from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.flow_keys import FAILURE_KEY, PENDING_KEY
from sandgate.proxy.mitm.closer import ConnectionCloser
from sandgate.proxy.mitm.trailers import TRAILERS_REFUSED
from sandgate.proxy.respond import upstream_error_response

__all__ = ["Trailers"]

log = structlog.get_logger("sandgate.trailers")


class Trailers:
    """Refuses HTTP/1 messages with trailers that mitmproxy's HTTP/1 writer cannot relay."""

    def __init__(self, closer: ConnectionCloser) -> None:
        self.closer = closer

    def response(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None or not response.trailers or not flow.request.http_version.startswith("HTTP/1"):
            return
        # Runs before the Gate's `response`, which records the exchange with this failure.
        log.warning("trailers.refused", side="response", host=flow.request.pretty_host)
        flow.metadata[FAILURE_KEY] = TRAILERS_REFUSED
        if response.stream:
            # Head and body are on their way to the guest: cut before the final chunk.
            if flow.killable:
                flow.kill()
            self.closer.close(flow.client_conn, flow.server_conn)
            return
        pending = flow.metadata.get(PENDING_KEY)
        decision_id = pending[0].decision_id if pending is not None else "-"
        refusal = upstream_error_response(Reason.UPSTREAM_UNREACHABLE, flow.request.pretty_host, decision_id)
        refusal.headers["Connection"] = "close"
        flow.response = refusal
        self.closer.close(flow.client_conn, flow.server_conn, keep_client=True)
