"""What sandgate changes inside mitmproxy's layers, each checked at start (its seams are no
promise): head caps, backpressure, close fixes, trailers and wire error texts.
"""
