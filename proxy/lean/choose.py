"""Addon: intercepted HTTP/1.1 connections on the lean layer (`interception.http1_path: lean`).

The runtime adds it to the pipeline right after the other layer choosers (`Shared.lean`).

In `next_layer`, after mitmproxy chose its HttpLayer for a decrypted tunnel and the error seam
and the HTTP/2 guard made it theirs, a connection whose client negotiated HTTP/1.1 (or no
ALPN) gets `LeanHttp1` in its place; the guarded layer is kept inside it, for the requests
the lean layer hands over. Plain HTTP through the proxy, HTTP/2, raw TCP and everything before
the tunnel keep mitmproxy's layers. Its `sandgate_lean_wait` hook is how a lean phase that an
addon suspended is waited for.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

import structlog
from mitmproxy import ctx
from mitmproxy.proxy import layer
from mitmproxy.proxy.layers import ClientTLSLayer, HttpLayer
from mitmproxy.proxy.layers.http import HTTPMode
from mitmproxy.utils import human

from sandgate.proxy.addons.heads import head_limits
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.lean.layer import LeanHttp1

__all__ = ["ENV_HTTP1_PATH", "LeanPath", "http1_path"]

log = structlog.get_logger("sandgate.lean")

_HTTP11 = (None, b"", b"http/1.1")  # no ALPN negotiated (b"") is HTTP/1.1 too
# The path when the config names none (tests/run.sh runs a part of the suite on the general one).
ENV_HTTP1_PATH = "SANDGATE_HTTP1_PATH"


def http1_path(config: GatewayConfig, env: Mapping[str, str] = os.environ) -> str:
    """`interception.http1_path`, else $SANDGATE_HTTP1_PATH, else "lean"."""
    if config.interception.http1_path is not None:
        return config.interception.http1_path
    text = env.get(ENV_HTTP1_PATH, "").strip() or "lean"
    if text not in ("general", "lean"):
        raise ConfigError(f"${ENV_HTTP1_PATH} must be 'general' or 'lean', not {text!r}")
    return text


class LeanPath:
    """Chooses the lean layer where it serves; waits for its suspended phases. In the pipeline
    only when `http1_path` is "lean"."""

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        try:
            self._choose(nextlayer)
        except Exception:
            # The general layer stays: it enforces everything the lean one does.
            log.exception("hook_failed", hook="lean.next_layer")

    def _choose(self, nextlayer: layer.NextLayer) -> None:
        chosen, context = nextlayer.layer, nextlayer.context
        if not isinstance(chosen, HttpLayer) or chosen.mode is not HTTPMode.transparent:
            return
        if context.client.alpn not in _HTTP11 or not context.client.tls:
            return
        # The layers made for this choice (mitmproxy's, the seam's) each appended themselves.
        made = 0
        while made < len(context.layers) and isinstance(context.layers[-1 - made], HttpLayer):
            made += 1
        below = len(context.layers) - 1 - made
        if made == 0 or below < 0 or not isinstance(context.layers[below], ClientTLSLayer):
            return
        del context.layers[-made:]
        options = ctx.options
        stream_above = human.parse_size(options.stream_large_bodies) if options.stream_large_bodies else None
        nextlayer.layer = LeanHttp1(context, chosen, head_limits(options), stream_above)

    async def sandgate_lean_wait(self, phase: asyncio.Task[None]) -> None:
        # Shielded: a connection that goes meanwhile does not cut an addon's work in half.
        await asyncio.shield(phase)
