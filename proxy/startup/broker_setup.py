"""Hand the policy's credential declarations to the broker, with every sandbox of each tenant;
or, for `policy explain`, only where they are bound."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from sandgate.brokers import Broker, BrokerConfigError, TenantCredentials
from sandgate.brokers.tenant_credentials import CompiledTenant, compile_tenant
from sandgate.policy.errors import PolicyLoadError, PolicySetError, SecretReferenceError, SourceLocation
from sandgate.policy.model.policyset import PolicySet

__all__ = ["PolicyCredentials", "configure_broker", "tenant_credentials"]


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
        raise _load_error(policy, e) from None


class PolicyCredentials:
    """Where a policy's credentials are bound, compiled as the broker compiles them, without
    their secrets (sandgate.policy.decide.CredentialBindings, for `policy explain`)."""

    def __init__(self, policy: PolicySet) -> None:
        """PolicySetError for what would fail the gateway's load (a credential declared twice)."""
        try:
            self._tables: dict[str, CompiledTenant] = {
                entry.tenant: compile_tenant(entry) for entry in tenant_credentials(policy)
            }
        except BrokerConfigError as e:
            raise _load_error(policy, e) from None

    def bound_names(self, tenant: str, host: str, port: int) -> tuple[str, ...]:
        table = self._tables.get(tenant)
        return table.bound_names(host, port) if table is not None else ()


def _load_error(policy: PolicySet, e: Exception) -> PolicySetError:
    # The broker names the tenant first ("tenant T: credential C: ..."): point at its file.
    source = next(
        (t.source for name, t in policy.tenants.items() if str(e).startswith(f"tenant {name}")), None
    )
    where = SourceLocation(source or "credentials")
    return PolicySetError([PolicyLoadError(where, "credentials", str(e))])
