"""Addon: upstream latency of intercepted HTTP requests (request sent → response headers).

Measured from mitmproxy's own timestamps, so it costs one subtraction per response; on a
fresh upstream connection it includes the connect (the gateway dials lazily, after deciding).
"""

from __future__ import annotations

import structlog
from mitmproxy import http

from sandgate.proxy.metrics import METRICS

__all__ = ["UpstreamTiming"]

log = structlog.get_logger("sandgate.metrics")


class UpstreamTiming:
    """Observes the upstream latency histogram; never touches the flow."""

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        try:
            response = flow.response
            sent = flow.request.timestamp_end
            if response is None or sent is None or flow.server_conn.timestamp_start is None:
                return  # answered by the gateway itself (a denial), not by an upstream
            METRICS.upstream_seconds(max(0.0, response.timestamp_start - sent))
        except Exception:
            # Metrics never decide anything: a fault here is logged, the flow is untouched.
            log.exception("hook_failed", hook="metrics.responseheaders")
