"""A live decision's `explain`: what `sandgate policy explain` says for the request a record
describes, decided by `sandgate.policy.explain` against the policy in force in this gateway
(its policy, resolver, address guard, Rego engine, reserved name and credential bindings).

A record keeps what the explanation needs except the scheme: a request with an SNI (or to
port 443) is taken as https. A connect or tls record is explained as `CONNECT host:port`,
a dns record as the DNS listener's query. The explanation runs on the event loop, as a guest's
decision does: it costs what one decision costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandgate.policy.decision import Identity, Phase
from sandgate.policy.explain import Explanation, explain, explain_name
from sandgate.policy.hosts import normalise_host
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.policytests import parse_request
from sandgate.policy.steps import default_engine
from sandgate.proxy.context import GatewayContext

__all__ = ["FIELDS", "explain_record", "explanation_view", "identity_of", "request_text"]

# What the console sends of a record (query arguments), all optional but host.
FIELDS = ("tenant", "sandbox", "phase", "method", "host", "port", "path", "sni")


def identity_of(policy: PolicySet, tenant: str, sandbox: str) -> Identity | None:
    """Who asked, as the policy in force knows them now; None: no identity (as in the record)."""
    registered = policy.sandboxes.get(sandbox) if sandbox else None
    if registered is not None:
        if tenant and tenant != registered.tenant:
            owner = registered.tenant
            raise ValueError(f"sandbox {sandbox!r} belongs to tenant {owner!r} now, not {tenant!r}")
        return Identity(registered.tenant, registered.sandbox)
    if tenant:
        return Identity(tenant, sandbox or "explain")
    return None


def request_text(fields: Mapping[str, str]) -> str:
    """The request as `policy explain` takes it: `GET https://host:port/path` or `CONNECT host:port`."""
    host = fields.get("host", "").strip()
    if not host:
        raise ValueError("the record names no host")
    port_text = fields.get("port") or "443"
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError("the record's port is not a port number")
    port = int(port_text)
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    method = fields.get("method", "").strip().upper()
    if fields.get("phase") != Phase.REQUEST or not method:
        return f"CONNECT {authority}"
    scheme = "https" if fields.get("sni") or port == 443 else "http"
    path = fields.get("path") or "/"
    return f"{method} {scheme}://{authority}{path if path.startswith('/') else '/' + path}"


async def explain_record(ctx: GatewayContext, fields: Mapping[str, str]) -> dict[str, Any]:
    """The explanation of the request a record describes (ValueError for one that cannot be)."""
    policy = ctx.policy
    identity = identity_of(policy, fields.get("tenant", ""), fields.get("sandbox", ""))
    if fields.get("phase") == Phase.DNS:
        name = normalise_host(fields.get("host", "").rstrip("."))
        return explanation_view(await explain_name(policy, identity, name), f"DNS {name}", identity)
    text = request_text(fields)
    result = await explain(
        policy,
        identity,
        parse_request(text),
        ctx.resolver,
        ctx.guard,
        ctx.engine or default_engine(),
        reserved=ctx.reserved.name if ctx.reserved is not None else None,
        bindings=ctx.broker,
    )
    return explanation_view(result, text, identity)


def explanation_view(result: Explanation, request: str, identity: Identity | None) -> dict[str, Any]:
    """The explanation as `policy explain --format json` gives it (the console shows it as text)."""
    d = result.decision
    value: dict[str, Any] = {
        "request": request,
        "tenant": identity.tenant if identity else None,
        "sandbox": identity.sandbox if identity else None,
        "decision": d.verdict,
        "reason": d.reason.value,
        "rule_id": d.rule_id,
        "policy_version": d.policy_version,
        "mode": d.mode.value,
        "detail": d.detail,
        "steps": [s.as_dict() for s in result.steps],
    }
    if result.rego is not None:
        v = result.rego.verdict
        value["rego"] = {
            "modules": list(result.rego.modules),
            "verdict": {"allow": v.allowed, "reason": v.reason.value, "message": v.message},
        }
    return value
