"""The mitmproxy addons, one concern each, in the one order `pipeline` gives them (the
gateway's and the in-process tests'): identify the sandbox, decide each tunnel (tunnel_gate)
and each request (request_gate), dial only what they allowed (dial_guard), count tenant
limits (limits), decide MCP, JSON-RPC and GraphQL messages in request bodies
(agent_protocols, reading them with protocol_bodies), ask the tenant's Rego about each of them
(agent_rego), decide the guest's WebSocket messages likewise (agent_websocket) and filter MCP
list answers (agent_lists),
complete the audit record (audit_completion), broker credentials
(credential_broker), and the guards on connections, heads, HTTP/2 streams, upgrades and
trailers; `drain` lets requests in flight finish on shutdown. One request's facts and its one
record travel in its `exchange`; what the front shares with them is in plain modules
(`guest_peer`, `tunnel_rules`).
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "agent_lists",
    "agent_protocols",
    "agent_rego",
    "agent_websocket",
    "audit_completion",
    "connection_limits",
    "credential_broker",
    "dial_guard",
    "drain",
    "exchange",
    "guest_peer",
    "h2_guard",
    "heads",
    "hop_by_hop",
    "http_seam",
    "identify",
    "latency",
    "limits",
    "message_rego",
    "pipeline",
    "protocol_bodies",
    "refusal",
    "request_gate",
    "trailers",
    "transparent",
    "tunnel_gate",
    "tunnel_rules",
    "upgrades",
]
