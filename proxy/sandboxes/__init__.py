"""Sandboxes at run time: registering one (address, listener, token) and listing them."""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "registration",
    "sandbox_listing",
]
