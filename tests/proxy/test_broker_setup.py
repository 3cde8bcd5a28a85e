"""proxy.broker_setup: the broker and `policy explain` say alike which credentials are bound where."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandgate.brokers import Broker, Secret
from sandgate.policy.decide import CredentialBindings
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.proxy.startup.broker_setup import PolicyCredentials, configure_broker

ACME = """
tenant: acme
allow: []
credentials:
  - name: api-key
    secret: env:ACME_API_KEY
    hosts: [api.test]
    inject: {header: Authorization, format: "Bearer {secret}"}
  - name: wild
    secret: env:ACME_WILD
    hosts: ["*.cdn.test"]
    ports: [443, 8443]
    inject: {header: X-Key}
"""
OTHER = """
tenant: other
allow: []
"""


@pytest.fixture
def policy(tmp_path: Path) -> PolicySet:
    (tmp_path / "tenants").mkdir()
    (tmp_path / "tenants" / "acme.yaml").write_text(textwrap.dedent(ACME))
    (tmp_path / "tenants" / "other.yaml").write_text(textwrap.dedent(OTHER))
    return load_policy_dir(tmp_path)


@pytest.fixture
async def broker(policy: PolicySet) -> AsyncIterator[Broker]:
    b = Broker(placeholder_key=Secret(b"broker-setup-test-key-0123456789abcdef"))
    configure_broker(b, policy)
    yield b
    await b.aclose()


@pytest.mark.parametrize(
    ("tenant", "host", "port", "names"),
    [
        ("acme", "api.test", 443, ("api-key",)),
        ("acme", "api.test", 8443, ()),
        ("acme", "a.cdn.test", 8443, ("wild",)),
        ("acme", "cdn.test", 443, ()),
        ("other", "api.test", 443, ()),
        ("gone", "api.test", 443, ()),
    ],
    ids=[
        "a credential bound to the host on its default port",
        "not on a port it does not name",
        "a wildcard binds the names under it",
        "but not the bare suffix",
        "another tenant's credentials are not its",
        "a tenant that is not defined has none",
    ],
)
async def test_the_broker_and_explain_bind_the_same_credentials(
    policy: PolicySet, broker: Broker, tenant: str, host: str, port: int, names: tuple[str, ...]
) -> None:
    implementations: list[CredentialBindings] = [broker, PolicyCredentials(policy)]
    assert [b.bound_names(tenant, host, port) for b in implementations] == [names, names]
    assert broker.binds(tenant, host, port) is bool(names)
