"""Host plumbing: nftables tables and rules, the host's own addresses, and listeners opened at
run time (the guests' DNS is sandgate.proxy.dns).
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "host_addresses",
    "host_table",
    "listen_backlog",
    "nft",
    "sandbox_listeners",
    "static_sandboxes",
]
