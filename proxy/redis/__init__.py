"""The fleet's redis (`redis:`): the one place clients are built (`client`) and the one object
that knows whether it is reachable (`outage`), which every user reports to.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = ["client", "outage"]
