"""The gateway's state folder: the lock one gateway holds, the status file, the nftables
table name and the unix socket paths derived from it.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "state_lock",
    "statusfile",
    "table_name",
    "unix_sockets",
]
