"""Credentials compiled for one tenant: where each may go, what it manages, which apply always."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sandgate.brokers.errors import BrokerConfigError
from sandgate.brokers.outcome import DenialCause
from sandgate.brokers.request import BrokerRequest
from sandgate.brokers.scan import Part, Where
from sandgate.policy.errors import HostError
from sandgate.policy.hosts import normalise_host
from sandgate.policy.model.credentials import AwsSigV4Inject, BodyInject, Credential, QueryInject
from sandgate.policy.model.secret_refs import SecretRef, parse_ref
from sandgate.policy.paths import normalise_path
from sandgate.policy.protocols.patterns import GlobList

__all__ = ["CompiledCredential", "CompiledTenant", "TenantCredentials", "compile_tenant"]


@dataclass(frozen=True, slots=True)
class TenantCredentials:
    """A tenant's credentials and sandboxes, as the policy declares them.

    `base_dir` is where relative `file:` references are resolved (the tenant file's folder).
    """

    tenant: str
    sandboxes: tuple[str, ...]
    credentials: tuple[Credential, ...]
    base_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class CompiledCredential:
    """One credential ready for matching."""

    credential: Credential
    base_dir: Path | None
    tenant: str
    exact_hosts: frozenset[str]
    suffixes: tuple[str, ...]
    managed_headers: frozenset[str]
    path_prefixes: tuple[str, ...] | None = field(default=None)
    # `tools:` compiled: the placeholder is replaced only in these tools' call arguments.
    tool_globs: GlobList | None = field(default=None)

    @property
    def name(self) -> str:
        return self.credential.name

    @property
    def kind(self) -> str:
        return self.credential.kind

    def ref(self, text: str) -> SecretRef:
        """A secret reference of this credential: relative `file:` paths made absolute, `stored:` names
        qualified with the tenant."""
        parsed = parse_ref(text).for_tenant(self.tenant)
        return parsed.relative_to(self.base_dir) if self.base_dir is not None else parsed

    def host_ok(self, host: str) -> bool:
        if host in self.exact_hosts:
            return True
        return any(host.endswith(suffix) for suffix in self.suffixes)

    def tool_bound(self, tool: str) -> bool:
        """Whether `tool` (a canonical MCP tool name) is one of this credential's `tools`."""
        return self.tool_globs is not None and self.tool_globs.match(tool) is not None

    def binding_failure(self, request: BrokerRequest, path: str | None) -> DenialCause | None:
        """None when the request is inside this credential's binding, else the first part that is not.

        `path` is the normalised request path, or None when it cannot be normalised.
        """
        cred = self.credential
        try:
            host = normalise_host(request.host)
        except HostError:
            return DenialCause.UNBOUND_HOST
        if not self.host_ok(host):
            return DenialCause.UNBOUND_HOST
        if request.port not in cred.ports:
            return DenialCause.UNBOUND_PORT
        scheme = request.scheme.lower()
        if scheme != "https" and not (scheme == "http" and cred.plaintext):
            return DenialCause.UNBOUND_SCHEME
        if cred.methods is not None and request.method.upper() not in cred.methods:
            return DenialCause.UNBOUND_METHOD
        if self.path_prefixes is not None and (path is None or not _under_any(path, self.path_prefixes)):
            return DenialCause.UNBOUND_PATH
        return None

    def consumes(self, where: Where) -> bool:
        """Whether the injector replaces a placeholder found at `where` (else it would be forwarded)."""
        inject = self.credential.inject
        if isinstance(inject, QueryInject):
            return where.part is Part.QUERY and where.name == inject.query
        if isinstance(inject, BodyInject):
            return where.part is Part.BODY and where.name == ""
        if isinstance(inject, AwsSigV4Inject):
            return where.part is Part.HEADER and where.name in ("authorization", "x-amz-security-token")
        return where.part is Part.HEADER and where.name in self.managed_headers


def _under_any(path: str, prefixes: Sequence[str]) -> bool:
    """`/v1` covers `/v1` and `/v1/...`, not `/v10`; `/v1/` covers what is below `/v1/`."""
    for prefix in prefixes:
        if path == prefix or path.startswith(prefix if prefix.endswith("/") else prefix + "/"):
            return True
    return False


def request_path(request: BrokerRequest) -> str | None:
    """The normalised path, or None when it cannot be read unambiguously."""
    try:
        return normalise_path(request.path or "/")
    except HostError:
        return None


@dataclass(frozen=True, slots=True)
class CompiledTenant:
    """A tenant's credentials by name, and those that apply to every matching request."""

    tenant: str
    sandboxes: tuple[str, ...]
    by_name: dict[str, CompiledCredential]
    always: tuple[CompiledCredential, ...]

    def bound_names(self, host: str, port: int) -> tuple[str, ...]:
        """The names of the credentials bound to host:port, in declaration order."""
        return tuple(n for n, c in self.by_name.items() if c.host_ok(host) and port in c.credential.ports)


def _compile(credential: Credential, base_dir: Path | None, tenant: str) -> CompiledCredential:
    exact = frozenset(h for h in credential.hosts if not h.startswith("*."))
    suffixes = tuple("." + h[2:] for h in credential.hosts if h.startswith("*."))
    return CompiledCredential(
        credential=credential,
        base_dir=base_dir,
        tenant=tenant,
        exact_hosts=exact,
        suffixes=suffixes,
        managed_headers=credential.managed_headers(),
        path_prefixes=credential.paths,
        # Case as written, like an allow list (MCP tool names are case-sensitive); a glob that
        # runs out of time does not match, so no secret is placed.
        tool_globs=GlobList(credential.tools) if credential.tools is not None else None,
    )


def _hosts_overlap(a: Iterable[str], b: Iterable[str]) -> bool:
    def one(x: str, y: str) -> bool:
        if x.startswith("*.") and y.startswith("*."):
            sx, sy = x[1:], y[1:]
            return sx == sy or sx.endswith(sy) or sy.endswith(sx)
        if x.startswith("*."):
            return y.endswith(x[1:])
        if y.startswith("*."):
            return x.endswith(y[1:])
        return x == y

    return any(one(x, y) for x in a for y in b)


def _overlap(a: CompiledCredential, b: CompiledCredential) -> bool:
    """Whether two credentials may both apply to one request (ignoring paths and methods)."""
    return bool(set(a.credential.ports) & set(b.credential.ports)) and _hosts_overlap(
        a.credential.hosts, b.credential.hosts
    )


def compile_tenant(entry: TenantCredentials) -> CompiledTenant:
    """Compile a tenant's credentials; BrokerConfigError for duplicates and always-on conflicts."""
    by_name: dict[str, CompiledCredential] = {}
    for credential in entry.credentials:
        if credential.name in by_name:
            raise BrokerConfigError(f"tenant {entry.tenant}: credential {credential.name} is declared twice")
        by_name[credential.name] = _compile(credential, entry.base_dir, entry.tenant)
    always = tuple(c for c in by_name.values() if c.credential.apply == "always")
    for i, a in enumerate(always):
        for b in always[i + 1 :]:
            shared = a.managed_headers & b.managed_headers
            same_query = (
                isinstance(a.credential.inject, QueryInject)
                and isinstance(b.credential.inject, QueryInject)
                and a.credential.inject.query == b.credential.inject.query
            )
            if (shared or same_query) and _overlap(a, b):
                raise BrokerConfigError(
                    f"tenant {entry.tenant}: credentials {a.name} and {b.name} both apply always "
                    "to the same hosts and set the same header or parameter"
                )
    return CompiledTenant(entry.tenant, tuple(entry.sandboxes), by_name, always)
