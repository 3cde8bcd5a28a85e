"""The `sandgate` command: `parser` is the argument tree, `main` imports and runs the one command
asked for; one module per command group."""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "admin",
    "audit",
    "ca",
    "credentials",
    "jail",
    "main",
    "parser",
    "policy",
    "policy_prove",
    "policy_reload",
    "requests",
    "run",
    "sandbox",
    "status",
    "stop",
    "token",
    "usage",
]
