"""Host plumbing: the DNS listener, nftables tables and rules, the host's own addresses, name
bindings from DNS answers, and listeners opened at run time.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "dns_listener",
    "host_addresses",
    "host_table",
    "listen_backlog",
    "name_bindings",
    "nft",
    "sandbox_listeners",
    "static_sandboxes",
]
