"""How the gateway is put together (`sandgate.proxy.runtime` reads as the list of these):
mitmproxy's patches and their self-checks, one builder per subsystem (the audit trail, the
credential broker, the Rego engine, the gateway context, the policy load, the fleet, the
stores, approvals, the passthrough front), and the services list, started in order and
stopped in reverse. The addon order is `sandgate.proxy.addons.pipeline`.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "approvals",
    "audit",
    "broker",
    "fleet",
    "front",
    "gateway_context",
    "mitmproxy_patches",
    "policy_load",
    "rego",
    "services",
    "stores",
]
