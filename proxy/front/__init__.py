"""The passthrough front: CONNECT tunnels passed through untouched, outside mitmproxy's layers.

It sits in front of each explicit (regular) listener. A connection whose first request is a
plain CONNECT that the policy passes through (allowed, not intercepted, not raw TCP) and whose
first bytes in the tunnel are a TLS ClientHello that fits it is decided, audited and spliced
here; every other connection (absolute-form requests, refusals, intercepted tunnels, anything
unusual) is handed to mitmproxy with the bytes read so far, so its addons decide it as before.
"""

__all__ = ["client_hello", "connect_head", "handoff", "passthrough", "splice"]
