"""What sandgate changes inside mitmproxy's layers, each checked at start (its seams are no
promise): head caps, backpressure, close fixes, trailers, wire error texts and the shared
explicit port of workers (SO_REUSEPORT).
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "backpressure",
    "close_fix",
    "closer",
    "head_caps",
    "reuse_port",
    "trailers",
    "wire_errors",
]
