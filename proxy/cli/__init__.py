"""The `sandgate` command: `main` parses and dispatches; one module per command group."""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "admin",
    "audit",
    "credentials",
    "main",
    "policy",
    "policy_reload",
    "sandbox",
    "status",
]
