"""`Broker`: the one object the gateway's addon talks to.

    broker = Broker(placeholder_key=key)            # env:, file:, cmd: sources; httpx for token endpoints
    broker.configure(tenants)                       # on every policy (re)load
    decision = await broker.plan(tenant, sandbox, request)
    BrokerDenial → 403 with decision.reason; BrokerAllow → apply decision.mutations, feed
    decision.body_guard a streamed body, and run the response through broker.scrubber(...)

Secrets are fetched for each request that needs them (each source decides what it caches:
a file is re-read when it changes, a command's output is kept for its TTL, tokens until
shortly before they expire), so a rotated secret is used by the next request. A secret that
cannot be had denies the request with `internal_error`; the placeholder is never forwarded.

The scrubbers must know a secret before any response could carry it, injected or not (a
bound host may echo a stored key the guest never asked for). So every secret a tenant can
inject is resolved off the request path by `refresh()` (the gateway runs it at start, after
each load, on stored-credential changes and every reload interval), and a request of a
tenant whose secrets were not resolved since the last `configure` or `secrets_changed`
waits for that first (fail closed; afterwards it is one comparison). A value that cannot
be resolved is logged once and retried each refresh; its credential's injections fail as
before, and it is scrubbed from the moment it is resolved (a request that resolves it
records it before it is forwarded). Values the gateway mints at run time (OAuth2 and
GitHub App tokens, a rotated refresh token) are scrubbed from the moment they are minted;
their client secrets, refresh tokens and private keys from the start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog

from sandgate.brokers.body_guard import RequestBodyGuard
from sandgate.brokers.errors import BrokerConfigError, BrokerError, SecretUnavailable
from sandgate.brokers.httpclient import AsyncHttpClient, HttpxClient
from sandgate.brokers.injectors import build_mutations
from sandgate.brokers.material import Material
from sandgate.brokers.outcome import BrokerAllow, BrokerDecision, BrokerDenial, DenialCause
from sandgate.brokers.placeholders import PlaceholderIndex, PlaceholderMinter, PlaceholderOwner
from sandgate.brokers.planner import Plan, plan_request
from sandgate.brokers.providers.github_app import GitHubAppProvider
from sandgate.brokers.providers.oauth2 import OAuth2Provider
from sandgate.brokers.request import BrokerRequest
from sandgate.brokers.scrub import MIN_SCRUB_BYTES, Scrubber
from sandgate.brokers.secret import Secret
from sandgate.brokers.sources.registry import SecretRegistry, default_registry
from sandgate.brokers.tenant_credentials import (
    CompiledCredential,
    CompiledTenant,
    TenantCredentials,
    compile_tenant,
)
from sandgate.policy.model.credentials import AwsSigV4Inject, BasicInject, GitHubAppInject, OAuth2Inject

__all__ = ["Broker"]

log = structlog.get_logger("sandgate.brokers")

_Provider = OAuth2Provider | GitHubAppProvider

# The longest a refresh waits for one credential's values (a `cmd:` has its own 10 s timeout).
RESOLVE_TIMEOUT = 15.0


@dataclass(frozen=True, slots=True)
class _State:
    """Everything `configure` builds, swapped in as one value."""

    tenants: Mapping[str, CompiledTenant]
    index: PlaceholderIndex


@dataclass(slots=True)
class _Known:
    """The secret values last resolved for one credential, and the ones before (still scrubbed)."""

    current: tuple[Secret, ...]
    previous: tuple[Secret, ...] = ()


class Broker:
    """Placeholders, injection decisions and response scrubbers for every tenant of one gateway."""

    def __init__(
        self,
        *,
        placeholder_key: Secret,
        secrets: SecretRegistry | None = None,
        http: AsyncHttpClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._minter = PlaceholderMinter(placeholder_key)
        self._secrets = secrets if secrets is not None else default_registry()
        self._http: AsyncHttpClient = http if http is not None else HttpxClient()
        self._owns_http = http is None
        self._clock = clock
        self._state = _State({}, PlaceholderIndex(self._minter))
        self._providers: dict[tuple[str, str], tuple[object, _Provider]] = {}
        # Values recorded by requests (minted tokens included), and by refresh().
        self._known: dict[tuple[str, str], _Known] = {}
        self._resolved: dict[tuple[str, str], _Known] = {}
        self._versions: dict[str, int] = {}
        # A tenant is primed for one state (one configure) and one count of stored-value changes.
        self._changes = 0
        self._primed: dict[str, tuple[_State, int]] = {}
        self._priming: dict[str, tuple[tuple[_State, int], asyncio.Task[None]]] = {}
        # Every priming task until it ends: one replaced in `_priming` (state changed) whose callers
        # gave up is otherwise held by nothing (the loop keeps only weak references).
        self._priming_tasks: set[asyncio.Task[None]] = set()
        self._unresolved: set[tuple[str, str]] = set()
        self._scrubbers: dict[tuple[str, str], tuple[int, Scrubber]] = {}

    # --- configuration -------------------------------------------------------------

    def configure(self, tenants: Iterable[TenantCredentials]) -> None:
        """Put tenants' credentials in force, all at once; on BrokerConfigError the old ones stay."""
        compiled: dict[str, CompiledTenant] = {}
        owners: list[PlaceholderOwner] = []
        for entry in tenants:
            if entry.tenant in compiled:
                raise BrokerConfigError(f"tenant {entry.tenant} is configured twice")
            table = compile_tenant(entry)
            for cred in table.by_name.values():
                for ref in _refs(cred):
                    if not self._secrets.supports(ref):
                        scheme = ref.split(":")[0]
                        raise BrokerConfigError(
                            f"tenant {entry.tenant}: credential {cred.name}: no secret source for '{scheme}:'"
                        )
            compiled[entry.tenant] = table
            owners.extend(
                PlaceholderOwner(entry.tenant, sandbox, name)
                for sandbox in table.sandboxes
                for name in table.by_name
            )
        live = {(t, n) for t, table in compiled.items() for n in table.by_name}
        # list(): configure runs in the reload worker thread while requests add entries. The
        # tables are replaced before the state, so what is resolved for the new state stays.
        self._providers = {k: v for k, v in list(self._providers.items()) if k in live}
        self._known = {k: v for k, v in list(self._known.items()) if k in live}
        self._resolved = {k: v for k, v in list(self._resolved.items()) if k in live}
        # One assignment: a request sees the old state (resolved) or the new one (to resolve).
        self._state = _State(compiled, PlaceholderIndex(self._minter, owners))
        self._scrubbers.clear()
        for tenant in compiled:
            self._bump(tenant)

    def secrets_changed(self) -> None:
        """Values behind the references may have changed (a stored credential was set, rotated or
        removed): each tenant's next request waits for them to be resolved again."""
        self._changes += 1

    async def refresh(self) -> None:
        """Resolve every secret every tenant can inject, so the scrubbers know it (off the request path)."""
        await asyncio.gather(*(self._prime(tenant) for tenant in self._state.tenants))

    async def _prime(self, tenant: str) -> None:
        """Resolve one tenant's secrets for the current state; concurrent callers share one run."""
        mark = (self._state, self._changes)
        running = self._priming.get(tenant)
        if running is not None and running[0][0] is mark[0] and running[0][1] == mark[1]:
            task = running[1]
        else:  # none yet, or one for a state or values that have changed since
            # brokers/ may not import sandgate.proxy.tasks: the task is held here until it ends.
            task = asyncio.ensure_future(self._resolve_tenant(tenant, mark))  # noqa: TID251
            entry = (mark, task)
            self._priming[tenant] = entry
            self._priming_tasks.add(task)

            def done(_: object) -> None:
                self._priming_tasks.discard(task)
                if self._priming.get(tenant) is entry:
                    del self._priming[tenant]

            task.add_done_callback(done)
        await asyncio.shield(task)

    async def _resolve_tenant(self, tenant: str, mark: tuple[_State, int]) -> None:
        table = mark[0].tenants.get(tenant)
        if table is not None:
            await asyncio.gather(*(self._resolve(tenant, cred) for cred in table.by_name.values()))
        self._primed[tenant] = mark

    async def _resolve(self, tenant: str, cred: CompiledCredential) -> None:
        key = (tenant, cred.name)
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT):
                values = await self._scrub_values(tenant, cred)
            self._remember(tenant, cred.name, values, self._resolved)
        except Exception as e:  # never let one credential stop the others from being known
            if key not in self._unresolved:
                self._unresolved.add(key)
                error = str(e) if isinstance(e, BrokerError) else type(e).__name__
                log.warning("broker.secret_unresolved", tenant=tenant, credential=cred.name, error=error)
            return
        if key in self._unresolved:
            self._unresolved.discard(key)
            log.info("broker.secret_resolved", tenant=tenant, credential=cred.name)

    async def _scrub_values(self, tenant: str, cred: CompiledCredential) -> tuple[Secret, ...]:
        """What must never reach the guest, short of a token only a request mints."""
        if isinstance(cred.credential.inject, OAuth2Inject | GitHubAppInject):
            # Client secret, refresh token, private key: known before any token is minted.
            return tuple([await self._secrets.get(cred.ref(ref)) for ref in _refs(cred)])
        return (await self._material(tenant, cred)).scrub

    async def _ensure_primed(self, tenant: str, state: _State) -> None:
        """Fail closed: a tenant's request waits until its secrets were resolved since the last change."""
        table = state.tenants.get(tenant)
        for _ in range(2):  # a second round when a change arrived during the first
            mark = self._primed.get(tenant)
            if table is None or not table.by_name or (mark and mark[0] is state and mark[1] == self._changes):
                return
            await self._prime(tenant)

    def placeholder(self, tenant: str, sandbox: str, credential: str) -> str | None:
        """The placeholder a sandbox holds for one credential."""
        return self._state.index.placeholder(tenant, sandbox, credential)

    def placeholders(self, tenant: str, sandbox: str) -> Mapping[str, str]:
        """Credential name → placeholder for one sandbox (to put in its environment)."""
        return self._state.index.for_sandbox(tenant, sandbox)

    def binds(self, tenant: str, host: str, port: int) -> bool:
        """Whether any credential of the tenant is bound to host:port (its TLS must be intercepted)."""
        return bool(self.bound_names(tenant, host, port))

    def bound_names(self, tenant: str, host: str, port: int) -> tuple[str, ...]:
        """The names of the tenant's credentials bound to host:port (sandgate.policy's
        CredentialBindings: the Rego input, and interception)."""
        table = self._state.tenants.get(tenant)
        return table.bound_names(host, port) if table is not None else ()

    def has_credentials(self, tenant: str) -> bool:
        """Whether the tenant declares any credential."""
        table = self._state.tenants.get(tenant)
        return bool(table and table.by_name)

    # --- requests ------------------------------------------------------------------

    async def plan(self, tenant: str, sandbox: str, request: BrokerRequest) -> BrokerDecision:
        """Plan the credential injection of one request the policy already allowed: the
        mutations and body guard to apply, or the denial (see `planner` for the order)."""
        state = self._state
        table = state.tenants.get(tenant) or CompiledTenant(tenant, (sandbox,), {}, ())
        await self._ensure_primed(tenant, state)
        plan = plan_request(table, state.index, sandbox, request)
        if isinstance(plan, BrokerDenial):
            return plan
        guard = RequestBodyGuard(table, state.index, sandbox, request) if plan.stream else None
        if not plan.credentials:
            return BrokerAllow(body_guard=guard)
        materials = await self._materials(tenant, sandbox, plan)
        if isinstance(materials, BrokerDenial):
            return materials
        mutations = build_mutations(plan, materials, request, datetime.fromtimestamp(self._clock(), UTC))
        if isinstance(mutations, BrokerDenial):
            return mutations
        return BrokerAllow(
            mutations=mutations,
            credentials=tuple(c.name for c in plan.credentials),
            injectors=tuple(c.kind for c in plan.credentials),
            tools=plan.tools,
            body_guard=guard,
        )

    def message_guard(self, tenant: str, sandbox: str, request: BrokerRequest) -> RequestBodyGuard:
        """A guard for what follows an allowed request and is never rewritten (WebSocket
        messages): feed it every message; any placeholder in them is a denial."""
        state = self._state
        table = state.tenants.get(tenant) or CompiledTenant(tenant, (sandbox,), {}, ())
        return RequestBodyGuard(table, state.index, sandbox, request)

    async def _materials(self, tenant: str, sandbox: str, plan: Plan) -> dict[str, Material] | BrokerDenial:
        out: dict[str, Material] = {}
        for cred in plan.credentials:
            try:
                material = await self._material(tenant, cred)
                self._remember(tenant, cred.name, material.scrub, self._known)
            except SecretUnavailable as e:
                log.warning(
                    "broker.secret_unavailable",
                    tenant=tenant,
                    sandbox=sandbox,
                    credential=cred.name,
                    error=str(e),
                )
                return BrokerDenial(DenialCause.SECRET_UNAVAILABLE, (cred.name,), detail=str(e))
            out[cred.name] = material
        return out

    async def _material(self, tenant: str, cred: CompiledCredential) -> Material:
        inject = cred.credential.inject
        if isinstance(inject, OAuth2Inject | GitHubAppInject):
            return await self._provider(tenant, cred).material()
        assert cred.credential.secret is not None
        secret = await self._secrets.get(cred.ref(cred.credential.secret))
        if isinstance(inject, BasicInject):
            username = inject.basic.username
            if username is None:
                user, colon, password = secret.reveal().partition(":")
                if not colon or not user or not password:
                    raise SecretUnavailable(f"credential {cred.name}: the secret must hold 'user:password'")
                username, secret = user, Secret(password)
            return Material(secret=secret, username=username, scrub=(secret,))
        if isinstance(inject, AwsSigV4Inject):
            return await self._aws_material(cred, inject, secret)
        return Material(secret=secret, scrub=(secret,))

    async def _aws_material(
        self, cred: CompiledCredential, inject: AwsSigV4Inject, secret: Secret
    ) -> Material:
        spec = inject.aws_sigv4
        if spec.access_key_id is not None:
            key_id = Secret(spec.access_key_id)
        elif spec.access_key_id_ref is not None:
            key_id = await self._secrets.get(cred.ref(spec.access_key_id_ref))
        else:
            key_text, colon, secret_text = secret.reveal().partition(":")
            if not colon or not key_text or not secret_text:
                raise SecretUnavailable(
                    f"credential {cred.name}: the secret must hold 'ACCESS_KEY_ID:SECRET_KEY'"
                )
            key_id, secret = Secret(key_text), Secret(secret_text)
        token = await self._secrets.get(cred.ref(spec.session_token_ref)) if spec.session_token_ref else None
        scrub = tuple(s for s in (secret, key_id, token) if s is not None)
        return Material(secret=secret, access_key_id=key_id, session_token=token, scrub=scrub)

    def _provider(self, tenant: str, cred: CompiledCredential) -> _Provider:
        inject = cred.credential.inject
        key = (tenant, cred.name)
        cached = self._providers.get(key)
        if cached is not None and cached[0] == inject:
            return cached[1]
        provider: _Provider
        if isinstance(inject, OAuth2Inject):
            provider = OAuth2Provider(
                inject.oauth2, secrets=self._secrets, http=self._http, clock=self._clock, resolve_ref=cred.ref
            )
        else:
            assert isinstance(inject, GitHubAppInject)
            provider = GitHubAppProvider(
                inject.github_app,
                secrets=self._secrets,
                http=self._http,
                clock=self._clock,
                resolve_ref=cred.ref,
            )
        self._providers[key] = (inject, provider)
        return provider

    # --- responses -----------------------------------------------------------------

    def _remember(
        self, tenant: str, credential: str, values: tuple[Secret, ...], into: dict[tuple[str, str], _Known]
    ) -> None:
        """Record the values a credential resolved to (for scrubbing); refuse ones too short to scrub."""
        for value in values:
            if len(value.reveal_bytes()) < MIN_SCRUB_BYTES:
                raise SecretUnavailable(
                    f"credential {credential}: a secret value is shorter than {MIN_SCRUB_BYTES} bytes"
                )
        key = (tenant, credential)
        known = into.get(key)
        if (
            known is not None
            and len(known.current) == len(values)
            and all(a == b for a, b in zip(known.current, values, strict=True))
        ):
            return
        previous = known.current if known is not None else ()
        into[key] = _Known(values, previous)
        self._bump(tenant)

    def _bump(self, tenant: str) -> None:
        self._versions[tenant] = self._versions.get(tenant, 0) + 1

    def scrubber(self, tenant: str, sandbox: str) -> Scrubber:
        """The response scrubber of one sandbox: its tenant's known secret values → its placeholders.

        Covers every value of the tenant's credentials, resolved by `refresh` or by a request,
        the current and the one before each rotation. Rebuilt only when those values change.
        Other tenants' secrets are not in it: a tenant's secret is only sent to its own bound
        hosts, and matching every tenant's secrets in every response would cost memory and
        time in the number of tenants for an upstream that discloses what it was given anyway.
        """
        version = self._versions.get(tenant, 0)
        cached = self._scrubbers.get((tenant, sandbox))
        if cached is not None and cached[0] == version:
            return cached[1]
        pairs: list[tuple[Secret, str]] = []
        for (owner, credential), known in [*self._known.items(), *self._resolved.items()]:
            if owner != tenant:
                continue
            placeholder = self.placeholder(tenant, sandbox, credential)
            if placeholder is None:
                continue
            pairs.extend((value, placeholder) for value in (*known.current, *known.previous))
        scrubber = Scrubber(pairs)
        self._scrubbers[(tenant, sandbox)] = (version, scrubber)
        return scrubber

    async def aclose(self) -> None:
        """Close the HTTP client the broker created."""
        if self._owns_http and isinstance(self._http, HttpxClient):
            await self._http.aclose()


def _refs(cred: CompiledCredential) -> list[str]:
    """Every secret reference a credential names."""
    c = cred.credential
    inject = c.inject
    refs = [c.secret] if c.secret is not None else []
    if isinstance(inject, AwsSigV4Inject):
        refs += [r for r in (inject.aws_sigv4.access_key_id_ref, inject.aws_sigv4.session_token_ref) if r]
    elif isinstance(inject, OAuth2Inject):
        refs += [r for r in (inject.oauth2.client_secret, inject.oauth2.refresh_token) if r]
    elif isinstance(inject, GitHubAppInject):
        refs.append(inject.github_app.private_key)
    return refs
