"""The guests' DNS: the listener that answers their queries (the DNS-exfiltration control) and
the name bindings its answers leave, which transparent connections are checked against.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = ["listener", "name_bindings"]
