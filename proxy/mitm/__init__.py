"""What sandgate changes inside mitmproxy's layers, each checked at start (its seams are no
promise): backpressure, close fixes, wire error texts, the WebSocket
guard (message cap, control frames, clean closes) and the shared explicit port of workers
(SO_REUSEPORT); and the per-event costs of mitmproxy's own that it cuts (hook dispatch,
message field checks, option reads).
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "backpressure",
    "close_fix",
    "closer",
    "dispatch",
    "lean_import",
    "message_check",
    "option_reads",
    "reuse_port",
    "speedups",
    "tunnel_meter",
    "websocket_guard",
    "wire_errors",
]
