"""Host plumbing: the DNS listener, nftables tables and rules, the host's own addresses, name
bindings from DNS answers, jails, and listeners opened at run time.
"""
