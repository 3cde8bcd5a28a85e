"""The one addon order: the gateway's whole pipeline, and the subsets in-process tests take."""

from __future__ import annotations

from pathlib import Path

import pytest
from mitmproxy.addons.proxyserver import Proxyserver

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.resolver import StaticResolver
from sandgate.proxy.addons.audit_completion import AuditCompletion
from sandgate.proxy.addons.dial_guard import DialGuard
from sandgate.proxy.addons.heads import HeadGuard
from sandgate.proxy.addons.identify import Identify
from sandgate.proxy.addons.limits import TenantLimits
from sandgate.proxy.addons.pipeline import Shared, pipeline
from sandgate.proxy.addons.request_gate import RequestGate
from sandgate.proxy.addons.tunnel_gate import TunnelGate
from sandgate.proxy.addons.upgrades import Upgrades
from sandgate.proxy.audit.trail import AuditLog, JsonlFileSink
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.mitm.closer import ConnectionCloser


@pytest.fixture
def ctx(tmp_path: Path) -> GatewayContext:
    (tmp_path / "rules" / "tenants").mkdir(parents=True)
    audit = AuditLog([JsonlFileSink(tmp_path / "audit.jsonl", max_bytes=1 << 20, backups=1)])
    return GatewayContext(load_policy_dir(tmp_path / "rules"), StaticResolver({}), AddressGuard([]), audit)


def test_a_subset_keeps_the_pipeline_order_whatever_order_it_is_named_in(ctx: GatewayContext) -> None:
    shared = Shared(closer=ConnectionCloser(Proxyserver()))
    only = [AuditCompletion, DialGuard, RequestGate, Upgrades, TenantLimits, HeadGuard, TunnelGate, Identify]
    names = [type(a).__name__ for a in pipeline(ctx, shared, only=only)]
    assert names == [
        "Identify",
        "HeadGuard",
        "Upgrades",
        "TunnelGate",
        "RequestGate",
        "DialGuard",
        "TenantLimits",
        "AuditCompletion",
    ]


def test_a_class_not_in_the_pipeline_is_refused(ctx: GatewayContext) -> None:
    with pytest.raises(TypeError, match="not in it: \\['Proxyserver2'\\]"):
        pipeline(ctx, Shared(), only=[Identify, type("Proxyserver2", (), {})])


def test_the_whole_pipeline_needs_every_shared_part(ctx: GatewayContext) -> None:
    with pytest.raises(TypeError, match=r"Shared\.server is needed"):
        pipeline(ctx, Shared())
