"""Protocol switches in the policy: only `websocket`, only on allow rules with `websocket: true`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import decide
from sandgate.policy.decision import EgressRequest, Identity, Phase
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.model.tenant import BaseFile, TenantFile
from sandgate.policy.reasons import Reason
from sandgate.policy.resolver import StaticResolver
from sandgate.policy.upgrade import requested_upgrade

TENANT = """
tenant: acme
mode: {mode}
allow:
  - id: api
    hosts: [api.example.com]
    methods: [GET]
  - id: api-ws
    hosts: [api.example.com]
    paths: ["/ws/**"]
    websocket: true
"""
HOSTS = {"api.example.com": ["93.184.216.34"]}


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([], None),
        ([("Upgrade", "websocket")], "websocket"),
        ([("upgrade", "WebSocket ")], "websocket"),
        ([("Upgrade", "h2c")], "h2c"),
        ([("Upgrade", "h2c"), ("Upgrade", "foo/2")], "h2c, foo/2"),
        ([("Upgrade", "websocket, h2c")], "websocket, h2c"),
        ([("Upgrade", "")], "?"),
    ],
    ids=[
        "no Upgrade header asks for nothing",
        "websocket",
        "any case and spacing is the same token",
        "h2c",
        "several Upgrade lines are one list",
        "a list with websocket is not websocket",
        "an empty Upgrade still asks for something",
    ],
)
def test_requested_upgrade(headers: list[tuple[str, str]], expected: str | None) -> None:
    assert requested_upgrade(headers) == expected


def _policy(tmp_path: Path, mode: str) -> PolicySet:
    (tmp_path / "tenants").mkdir()
    (tmp_path / "tenants" / "acme.yaml").write_text(textwrap.dedent(TENANT.format(mode=mode)))
    return load_policy_dir(tmp_path)


@pytest.mark.parametrize(
    ("path", "upgrade", "reason", "rule_id"),
    [
        ("/v1/items", None, Reason.ALLOWED, "acme/allow/api"),
        ("/ws/chat", "websocket", Reason.ALLOWED, "acme/allow/api-ws"),
        ("/v1/items", "websocket", Reason.UPGRADE_NOT_ALLOWED, "acme/allow/api"),
        ("/ws/chat", "h2c", Reason.UPGRADE_NOT_ALLOWED, "acme/allow/api-ws"),
        ("/ws/chat", "websocket, foo", Reason.UPGRADE_NOT_ALLOWED, "acme/allow/api-ws"),
    ],
    ids=[
        "a plain request matches the first rule",
        "a WebSocket handshake matches the rule that allows WebSockets",
        "a WebSocket where no rule allows one is upgrade_not_allowed",
        "no rule can allow another protocol",
        "nor a list of protocols",
    ],
)
async def test_only_a_websocket_rule_admits_a_websocket(
    tmp_path: Path, path: str, upgrade: str | None, reason: Reason, rule_id: str
) -> None:
    policy = _policy(tmp_path, "enforce")
    request = EgressRequest(
        Phase.REQUEST, "api.example.com", 443, scheme="https", method="GET", path=path, upgrade=upgrade
    )
    decision = await decide(policy, Identity("acme", "a1"), request, StaticResolver(HOSTS), AddressGuard())
    assert (decision.reason, decision.allowed, decision.rule_id) == (
        reason,
        reason is Reason.ALLOWED,
        rule_id,
    )


async def test_report_mode_lets_an_upgrade_through_as_would_deny(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "report")
    request = EgressRequest(
        Phase.REQUEST, "api.example.com", 443, scheme="https", method="GET", path="/v1", upgrade="websocket"
    )
    decision = await decide(policy, Identity("acme", "a1"), request, StaticResolver(HOSTS), AddressGuard())
    assert (decision.allowed, decision.report_only, decision.reason) == (
        True,
        True,
        Reason.UPGRADE_NOT_ALLOWED,
    )


@pytest.mark.parametrize(
    ("model", "doc"),
    [
        (TenantFile, {"tenant": "t", "deny": [{"hosts": ["a.example.com"], "websocket": True}]}),
        (BaseFile, {"deny": [{"hosts": ["a.example.com"], "websocket": True}]}),
        (
            TenantFile,
            {"tenant": "t", "allow": [{"hosts": ["a.example.com"], "protocol": "tcp", "websocket": True}]},
        ),
    ],
    ids=["on a tenant deny rule", "on a base deny rule", "on a raw TCP rule"],
)
def test_websocket_is_refused_where_it_means_nothing(
    model: type[TenantFile | BaseFile], doc: dict[str, object]
) -> None:
    with pytest.raises(ValidationError, match="websocket"):
        model.model_validate(doc)
