"""Hand the policy's credential declarations to the broker, with every sandbox of each tenant."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from sandgate.brokers import Broker, BrokerConfigError, TenantCredentials
from sandgate.policy.errors import PolicyLoadError, PolicySetError, SecretReferenceError, SourceLocation
from sandgate.policy.model.policyset import PolicySet

__all__ = ["configure_broker", "tenant_credentials"]


def tenant_credentials(policy: PolicySet) -> list[TenantCredentials]:
    """Each tenant's credentials and sandboxes (static and registered), as the broker takes them."""
    sandboxes: dict[str, list[str]] = defaultdict(list)
    for record in policy.sandboxes.values():
        sandboxes[record.tenant].append(record.sandbox)
    return [
        TenantCredentials(
            tenant=name,
            sandboxes=tuple(sorted(sandboxes[name])),
            credentials=tuple(tenant.credentials),
            base_dir=Path(tenant.source).parent,
        )
        for name, tenant in policy.tenants.items()
    ]


def configure_broker(broker: Broker, policy: PolicySet) -> None:
    """Put the policy's credentials in force; a bad one fails the (re)load like a bad rule."""
    try:
        broker.configure(tenant_credentials(policy))
    except (BrokerConfigError, SecretReferenceError) as e:
        # The broker names the tenant first ("tenant T: credential C: ..."): point at its file.
        source = next(
            (t.source for name, t in policy.tenants.items() if str(e).startswith(f"tenant {name}")), None
        )
        where = SourceLocation(source or "credentials")
        raise PolicySetError([PolicyLoadError(where, "credentials", str(e))]) from None
