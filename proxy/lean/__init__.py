"""The lean HTTP/1.1 path (issue 29): intercepted HTTP/1.1 exchanges without mitmproxy's
general HTTP machinery, with every addon's work unchanged.

Inside a decrypted HTTP/1.1 tunnel mitmproxy runs an `HttpLayer` with an `HttpStream` per
request, an `Http1Server` and an `Http1Client` below it, one asyncio task per hook and a
`HookCompleted` event back through the stack for each. `LeanHttp1` (`layer`) reads and writes
HTTP/1.1 with mitmproxy's own functions, builds the same `HTTPFlow`, and runs the same hooks on
the same addons in two phases per exchange (`phases`), in-line when no addon suspends.

It serves only what it fully understands (`plain`: a complete origin-form HTTP/1.1 head under
the caps, no upgrade, no `Expect`, no trailers, a body of known framing); anything else, from
the first byte of that request on, goes to the general path (the guarded `HttpLayer` made for
the tunnel), which then serves the rest of the connection exactly as before.
"""

__all__ = ["choose", "layer", "phases", "plain", "upstream"]
