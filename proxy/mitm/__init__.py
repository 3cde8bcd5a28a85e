"""What sandgate changes inside mitmproxy's layers, each checked at start (its seams are no
promise): head caps, backpressure, close fixes, trailers and wire error texts.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "backpressure",
    "close_fix",
    "closer",
    "head_caps",
    "trailers",
    "wire_errors",
]
