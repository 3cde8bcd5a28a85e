"""Routes of the admin API: JSON in and out, errors as `{"error": ..., "field": ...}`.

Request bodies are validated with pydantic; an error names the field but never echoes the
input (a credential value must not come back in a 422). Credential values are write-only.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Annotated, Any, Literal

import structlog
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError
from tornado.routing import Rule
from tornado.web import Application, HTTPError, RequestHandler

from sandgate.brokers import Secret
from sandgate.policy.model.tenant import NAME_PATTERN
from sandgate.proxy.admin.access_requests import (
    GRANTS_REFRESH_PATH,
    INTERNAL_PATH,
    desk,
    list_requests,
    settle_request,
    show_request,
)
from sandgate.proxy.admin.fanout import (
    CREDENTIALS_PATH,
    METRICS_PATH,
    RELOAD_PATH,
    WORKER_PATH,
    What,
    failed,
    gateway_metrics,
    invalidate_credentials,
    reload_peers,
    worker_view,
    workers_status,
)
from sandgate.proxy.admin.state import AdminState
from sandgate.proxy.approvals import SettleError
from sandgate.proxy.approvals.grants import GrantStoreError
from sandgate.proxy.approvals.operator_decisions import approve, list_grants, revoke_grant
from sandgate.proxy.console.explain import explain_record
from sandgate.proxy.metrics import METRICS
from sandgate.proxy.net.sandbox_listeners import SandboxListenersError
from sandgate.proxy.redis.outage import REDIS_OUTAGE
from sandgate.proxy.refresh.reloader import problem_view
from sandgate.proxy.sandboxes.sandbox_listing import limits_used, sandbox_rows
from sandgate.proxy.stores.protocols import CredentialInfo, StoreError
from sandgate.proxy.stores.registry import DynamicSandbox
from sandgate.proxy.stores.registry_change import sandbox_changes, sandbox_update_record

__all__ = [
    "AdminActions",
    "ApiError",
    "decide_here",
    "decide_request",
    "gateway_status",
    "make_app",
    "readiness",
    "valid_request_id",
    "withdraw_grant",
]

log = structlog.get_logger("sandgate.admin")

_NAME = re.compile(NAME_PATTERN)


class ApiError(Exception):
    """An answer other than 2xx, with the field it is about."""

    def __init__(self, status: int, message: str, field: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.extra = extra


class CredentialValue(BaseModel):
    """`PUT /v1/credentials/{tenant}/{name}` body."""

    model_config = ConfigDict(extra="forbid")

    value: Annotated[str, Field(min_length=1, max_length=64 * 1024)]


class _Handler(RequestHandler):
    """Auth, JSON answers and JSON errors for every route."""

    def initialize(self, state: AdminState, token: Secret | None, require_token: bool) -> None:
        self.state = state
        self.token = token
        self.require_token = require_token
        self.trusted = False

    def set_default_headers(self) -> None:
        self.clear_header("Server")
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")

    # Health and readiness answer without a token: orchestrators' probes carry none.
    probe = False

    def prepare(self) -> None:
        header = self.request.headers.get("Authorization")
        if self.token is None or (header is None and not self.require_token):
            self.trusted = True  # the unix socket: its file mode is the guard
            return
        if self.probe and header is None:
            return
        expected = b"Bearer " + self.token.reveal().encode()
        if not hmac.compare_digest((header or "").encode(), expected):
            raise ApiError(401, "missing or wrong bearer token")
        self.trusted = True

    def reply(self, body: dict[str, Any], status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(body) + "\n")

    def parse[M: BaseModel](self, model: type[M]) -> M:
        """The body as `model`; 400 for unreadable JSON, 422 naming the first bad field."""
        try:
            return model.model_validate_json(self.request.body or b"")
        except ValidationError as e:
            err = e.errors(include_url=False, include_input=False)[0]
            if err["type"] == "json_invalid":
                raise ApiError(400, "the body is not valid JSON") from None
            field = ".".join(str(p) for p in err["loc"]) or None
            message = "required field is missing" if err["type"] == "missing" else str(err["msg"])
            message = message.removeprefix("Value error, ")
            raise ApiError(422, message, field) from None

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        # Tornado answers any exception with 500 first; ours carry the status they mean.
        if isinstance(exc, ApiError):
            self.set_status(exc.status)
            body = {"error": exc.message, "field": exc.field, **exc.extra}
        elif isinstance(exc, StoreError):
            self.set_status(exc.status)
            body = {"error": str(exc), "field": None}
        else:
            body = {"error": self._reason.lower(), "field": None}
        if self.get_status() == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="sandgate"')
        self.finish(json.dumps(body) + "\n")

    def log_exception(
        self,
        typ: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Only the type: a store's exception text is not ours to print.
        if not isinstance(value, ApiError | StoreError | HTTPError):
            log.error("admin.handler_failed", path=self.request.path, error=type(value).__name__)


def _name(value: str, field: str) -> str:
    if not _NAME.fullmatch(value):
        raise ApiError(422, "lowercase letters, digits, '.', '_' or '-', up to 63 characters", field)
    return value


class NotFound(_Handler):
    def prepare(self) -> None:
        super().prepare()
        raise ApiError(404, "no such endpoint")


class Health(_Handler):
    probe = True

    def get(self) -> None:
        self.reply({"status": "alive", "pid": os.getpid()} if self.trusted else {"status": "alive"})


class Ready(_Handler):
    probe = True

    async def get(self) -> None:
        body = await readiness(self.state)
        self.reply(body, 200 if body["ready"] else 503)


async def readiness(state: AdminState) -> dict[str, Any]:
    """What /readyz answers (and the console's health page shows): each check, and `ready`."""
    checks: dict[str, bool] = {
        "policy_loaded": state.ctx.policy is not None,
        "listeners_bound": state.ready(),
    }
    if state.redis is not None:
        # Its own ping, reported like every other call (REDIS_OUTAGE knows since when).
        try:
            checks["redis"] = bool(await asyncio.wait_for(state.redis.ping(), state.redis_timeout))
        except Exception as e:
            REDIS_OUTAGE.failed("readyz", e)
            checks["redis"] = False
        else:
            REDIS_OUTAGE.reached("readyz")
    body: dict[str, Any] = {"checks": checks}
    if state.peers is not None:
        # The lead answers for the gateway: a worker that is down (restarting) leaves the
        # sandboxes steered to its transparent port unserved.
        workers = await workers_status(state)
        ready_workers = [w["index"] for w in workers if w.get("ready") is True]
        checks["workers_ready"] = len(ready_workers) == len(workers)
        body["workers"] = {"count": len(workers), "ready": ready_workers}
    return {"ready": all(checks.values()), **body}


def _status(state: AdminState) -> dict[str, Any]:
    policy = state.ctx.policy
    last = state.reloader.last
    return {
        "gateway_id": state.gateway_id,
        "pid": os.getpid(),
        "ready": state.ready(),
        "uptime_seconds": round(time.time() - state.started, 3),
        "policy_version": policy.version,
        "tenants": len(policy.tenants),
        "sandboxes": len(policy.sandboxes),
        "tenant_names": sorted(policy.tenants),
        # Every sandbox served (tenant files and registry): tenant, token reference, addresses, origin.
        "sandbox_list": sandbox_rows(policy),
        "listeners": state.listeners(),
        **_sandbox_listener_status(state),
        "last_reload": None
        if last is None
        else {
            "ok": last.ok,
            "trigger": last.trigger,
            "time": last.time,
            "policy_version": last.policy_version,
            "errors": list(last.errors),
            "broken_files": [p.file for p in last.problems],
        },
        "reload_failures": state.reloader.failures,
        "policy_problems": [problem_view(p) for p in policy.problems],
        "policy_notices": [str(n) for n in policy.notices],
        "audit_queue_depth": state.ctx.audit.depth,
        "active_connections": len(state.ctx.connections),
        "fleet_publish": state.publish_reload is not None,
        # Each rate and byte limit in force, and how much of it is used now.
        "limits_used": limits_used(policy, state.ctx.limiter),
        # Each SIEM sink: queued, delivered, retried, dropped (the lead of workers reports them).
        "audit_sinks": [f._asdict() for f in state.audit_sinks()],
    }


def _sandbox_listener_status(state: AdminState) -> dict[str, Any]:
    listeners = state.sandbox_listeners
    if listeners is None:
        return {}
    return {
        "transparent_port": listeners.transparent_port(),
        "dns_port": listeners.dns.port if listeners.dns else None,
        "opened_on_demand": list(listeners.opened),
    }


async def gateway_status(state: AdminState) -> dict[str, Any]:
    """What /v1/status answers (and the console's health and sandboxes pages show)."""
    body = _status(state)
    if state.role.count > 1:
        body["worker"] = {"index": state.role.index, "count": state.role.count}
    if state.peers is not None:
        body["workers"] = await workers_status(state)
    return body


class Status(_Handler):
    async def get(self) -> None:
        self.reply(await gateway_status(self.state))


async def _reload(state: AdminState, trigger: str, *, registry_changed: bool = False) -> dict[str, Any]:
    """Reload this worker, then (the lead of several) every peer; an ApiError when any did not
    (a failed reload keeps the old policy; a peer that did not confirm is named)."""
    if state.peers is not None and (not registry_changed or state.refresh is None):
        return await _reload_with_peers(state, trigger, registry_changed)
    try:
        body = await _reload_here(state, trigger, registry_changed=registry_changed)
    except ApiError as e:
        if state.peers is not None:
            # The others reload even so: each keeps or replaces its policy as its load decides.
            what: What = "registry" if registry_changed else "policy"
            e.extra["workers"], _ = await reload_peers(state, what, trigger, lead_ok=False)
        raise
    if state.peers is None:
        return body
    body["workers"], answers = await reload_peers(
        state, "registry" if registry_changed else "policy", trigger, lead_ok=True
    )
    problem = failed(answers)
    if problem is not None:
        change = "the registry change is" if registry_changed else "the reloaded policy is"
        raise ApiError(
            503,
            f"{change} in force on worker {state.role.index}, not confirmed by every worker: {problem}",
            workers=body["workers"],
            policy_version=state.ctx.policy.version,
        )
    return body


async def _reload_with_peers(state: AdminState, trigger: str, registry_changed: bool) -> dict[str, Any]:
    """The lead of several, on files: its reloader asks every peer to load the same files and
    writes the reload's one audit record once they answered."""
    try:
        body = await _reload_here(state, trigger, with_peers=True)
    except ApiError as e:
        e.extra["workers"] = state.reloader.last_workers or []
        raise
    body["workers"] = workers = state.reloader.last_workers or []
    problems = [str(w.get("error") or f"worker {w.get('index')} failed") for w in workers if not w.get("ok")]
    if problems:
        change = "the registry change is" if registry_changed else "the reloaded policy is"
        raise ApiError(
            503,
            f"{change} in force on worker {state.role.index}, not confirmed by every worker: "
            + "; ".join(problems),
            workers=workers,
            policy_version=state.ctx.policy.version,
        )
    return body


async def _reload_here(
    state: AdminState,
    trigger: str,
    *,
    registry_changed: bool = False,
    if_changed: bool = False,
    with_peers: bool = False,
) -> dict[str, Any]:
    """Reload this worker (`if_changed`: unless the files in force are those on disk); the
    errors of a failed reload in an ApiError (the old policy stays)."""
    previous = state.ctx.policy.version
    if registry_changed and state.refresh is not None:
        if not await state.refresh(trigger):
            raise ApiError(503, "the registry changed, but redis could not be read back; retry")
        last = state.reloader.last
        ok = last is None or last.ok
    elif if_changed:
        ok = await state.reloader.reload_if_changed(trigger)
    else:
        ok = await state.reloader.reload(trigger, with_peers=with_peers)
    last = state.reloader.last
    if not ok:
        errors = list(last.errors) if last else []
        raise ApiError(
            422,
            "policy reload failed; the previous policy stays in force",
            errors=errors,
            policy_version=state.ctx.policy.version,
        )
    policy = state.ctx.policy
    return {
        "ok": True,
        "policy_version": policy.version,
        "previous_policy_version": previous,
        "tenants": sorted(policy.tenants),
        "sandboxes": len(policy.sandboxes),
        # Tenant files that did not load while the rest did (each keeps its last good version or has none).
        "policy_problems": [problem_view(p) for p in policy.problems],
    }


async def _publish(state: AdminState, policy_version: str) -> dict[str, Any]:
    """Fleet mode: tell every gateway to reload; the fleet version to wait for, or published false."""
    assert state.publish_reload is not None
    try:
        return {"fleet_version": await state.publish_reload(policy_version), "published": True}
    except Exception as e:
        log.error("admin.publish_reload_failed", error=type(e).__name__)
        return {"published": False}


class PolicyReload(_Handler):
    async def post(self) -> None:
        try:
            body = await _reload(self.state, "admin")
        except ApiError as e:
            # The fleet reloads even when this gateway's copy of the files does not load:
            # the others may load theirs, and each answers for itself.
            if e.status in (422, 503) and self.state.publish_reload is not None:
                e.extra.update(await _publish(self.state, self.state.ctx.policy.version))
            raise
        if self.state.publish_reload is not None:
            body.update(await _publish(self.state, body["policy_version"]))
        self.reply(body)


class SandboxListenersRoute(_Handler):
    async def post(self) -> None:
        """Open the transparent and DNS listeners sandboxes (jails) need, unless open already."""
        listeners = self.state.sandbox_listeners
        if listeners is None:
            raise ApiError(501, "this gateway cannot open listeners at run time")
        try:
            transparent, dns = await listeners.ensure()
        except SandboxListenersError as e:
            raise ApiError(503, str(e)) from None
        self.reply(
            {"transparent_port": transparent, "dns_port": dns, "opened_on_demand": list(listeners.opened)}
        )


def _sandboxes(state: AdminState) -> Any:
    if state.sandboxes is None:
        raise ApiError(501, "no sandbox store configured")
    return state.sandboxes


class Sandboxes(_Handler):
    async def get(self) -> None:
        entries = await _sandboxes(self.state).list()
        self.reply({"sandboxes": [s.model_dump(exclude_none=True) for s in entries]})

    async def post(self) -> None:
        store = _sandboxes(self.state)
        sandbox = self.parse(DynamicSandbox)
        if sandbox.tenant not in self.state.ctx.policy.tenants:
            raise ApiError(422, f"unknown tenant {sandbox.tenant!r}", "tenant")
        await store.add(sandbox)
        body = await _reload(self.state, "admin:sandbox_add", registry_changed=True)
        self.reply({"sandbox": sandbox.model_dump(exclude_none=True), **body}, 201)


class Sandbox(_Handler):
    async def put(self, sandbox_id: str) -> None:
        """Change a registered sandbox in place: one registry write, then one policy swap, so
        its traffic is decided for the old tenant until the swap and the new one after it."""
        store = _sandboxes(self.state)
        sandbox = self.parse(DynamicSandbox)
        if sandbox.id != _name(sandbox_id, "id"):
            raise ApiError(422, "the body's id differs from the path's; ids cannot be renamed", "id")
        if sandbox.tenant not in self.state.ctx.policy.tenants:
            raise ApiError(422, f"unknown tenant {sandbox.tenant!r}", "tenant")
        previous = await store.replace(sandbox)
        if previous is None:
            raise ApiError(404, f"no registered sandbox {sandbox_id!r}; add it with `sandbox add`", "id")
        old_version = self.state.ctx.policy.version
        changed = sandbox_changes(previous, sandbox)
        try:
            body = await _reload(self.state, "admin:sandbox_update", registry_changed=True)
        except ApiError:
            # Refused tenant files keep their rules, yet the new registry may be in force: then
            # the change happened and is recorded, whatever the answer says about the files.
            if self.state.ctx.policy.version != old_version:
                await self._record_update(previous, sandbox, changed, old_version)
            raise
        await self._record_update(previous, sandbox, changed, old_version)
        self.reply({"sandbox": sandbox.model_dump(exclude_none=True), "changed": changed, **body})

    async def _record_update(
        self, previous: DynamicSandbox, sandbox: DynamicSandbox, changed: list[str], old_version: str
    ) -> None:
        version = self.state.ctx.policy.version
        log.info(
            "admin.sandbox_updated",
            sandbox=sandbox.id,
            old_tenant=previous.tenant,
            tenant=sandbox.tenant,
            changed=changed,
            policy_version=version,
        )
        await self.state.ctx.audit.emit(
            sandbox_update_record(previous, sandbox, changed, old_version, version)
        )

    async def delete(self, sandbox_id: str) -> None:
        store = _sandboxes(self.state)
        if not await store.remove(_name(sandbox_id, "id")):
            raise ApiError(404, f"no registered sandbox {sandbox_id!r}", "id")
        body = await _reload(self.state, "admin:sandbox_remove", registry_changed=True)
        self.reply({"removed": sandbox_id, **body})


def _credentials(state: AdminState) -> Any:
    if state.credentials is None:
        raise ApiError(501, "no credential store configured")
    return state.credentials


def _info(info: CredentialInfo) -> dict[str, Any]:
    return {"tenant": info.tenant, "name": info.name, "version": info.version, "updated": info.updated}


class Credentials(_Handler):
    async def get(self) -> None:
        store = _credentials(self.state)
        tenant = self.get_query_argument("tenant", None)
        if tenant is not None:
            _name(tenant, "tenant")
        self.reply({"credentials": [_info(i) for i in await store.list(tenant)]})


class Credential(_Handler):
    def _target(self, tenant: str, name: str) -> tuple[str, str]:
        _name(tenant, "tenant")
        _name(name, "name")
        if tenant not in self.state.ctx.policy.tenants:
            raise ApiError(404, f"unknown tenant {tenant!r}", "tenant")
        return tenant, name

    async def _changed(self, tenant: str, name: str) -> None:
        """Every worker stops using the old value now, not at its watcher's next look."""
        if self.state.credentials_changed is not None:
            self.state.credentials_changed()
        if self.state.peers is None:
            return
        problem = failed(await invalidate_credentials(self.state))
        if problem is not None:
            raise ApiError(
                503,
                f"credential {name!r} of tenant {tenant!r} changed in the store; "
                f"not every worker confirmed it dropped its cached value: {problem}",
                "name",
            )

    async def put(self, tenant: str, name: str) -> None:
        store = _credentials(self.state)
        tenant, name = self._target(tenant, name)
        value = Secret(self.parse(CredentialValue).value)
        info = await store.put(tenant, name, value)
        await self._changed(tenant, name)
        log.info("admin.credential_set", tenant=tenant, name=name, version=info.version)
        self.reply({"credential": _info(info)})

    async def delete(self, tenant: str, name: str) -> None:
        store = _credentials(self.state)
        tenant, name = self._target(tenant, name)
        if not await store.remove(tenant, name):
            raise ApiError(404, f"no credential {name!r} for tenant {tenant!r}", "name")
        await self._changed(tenant, name)
        log.info("admin.credential_removed", tenant=tenant, name=name)
        self.reply({"removed": {"tenant": tenant, "name": name}})


class Metrics(_Handler):
    async def get(self) -> None:
        """This worker's metrics; on the lead of several, the whole gateway's, merged."""
        text = METRICS.exposition() if self.state.peers is None else await gateway_metrics(self.state)
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(text)


class InternalReload(_Handler):
    """A peer: reload its policy or its copy of the registry, as the lead asks."""

    async def post(self) -> None:
        ask = self.parse(ReloadAsk)
        self.reply(
            await _reload_here(
                self.state, ask.trigger, registry_changed=ask.what == "registry", if_changed=ask.if_changed
            )
        )


class InternalCredentials(_Handler):
    """A peer: drop cached stored credentials (the lead changed one)."""

    def post(self) -> None:
        if self.state.credentials_changed is not None:
            self.state.credentials_changed()
        self.reply({"ok": True})


class InternalWorker(_Handler):
    def get(self) -> None:
        self.reply(worker_view(self.state))


class InternalMetrics(_Handler):
    def get(self) -> None:
        self.reply({"worker": worker_view(self.state), "exposition": METRICS.exposition().decode()})


class LeadOnly(_Handler):
    """A peer's private socket changes nothing itself: changes go through the lead."""

    def prepare(self) -> None:
        super().prepare()
        raise ApiError(
            403,
            f"this is worker {self.state.role.index}'s private socket: use the gateway's admin API "
            "(served by worker 0)",
        )


class AccessDecision(BaseModel):
    """`POST /v1/access-requests/{id}/approve|deny` body: who decides, and why (both optional)."""

    model_config = ConfigDict(extra="forbid")

    by: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    reason: Annotated[str, Field(max_length=2000)] | None = None
    # Approvals only: once (a held request's default), sandbox (a proposal's) or tenant; the
    # grant's TTL (sandbox: approvals.grant_ttl_seconds by default; capped by grant_max_ttl_seconds).
    scope: Literal["once", "sandbox", "tenant"] | None = None
    ttl_seconds: Annotated[float, Field(gt=0)] | None = None
    # Or the grant's end as an RFC 3339 time with its zone (not both; capped the same way).
    expires_at: AwareDatetime | None = None
    # At most this many requests the grant lets through, counted by the gateway (not a tool grant).
    max_uses: Annotated[int, Field(ge=1, le=1_000_000_000)] | None = None
    # A held tool call's grant (scope sandbox or tenant) for its tool whatever the arguments
    # (default: only its exact arguments, by their digest).
    any_arguments: bool = False


_REQUEST_ID = re.compile(r"^[0-9a-f]{12,64}$")


def valid_request_id(value: str) -> bool:
    """Whether `value` has the form of an access request's (or grant's) id."""
    return _REQUEST_ID.fullmatch(value) is not None


def _request_id(value: str) -> str:
    if not _REQUEST_ID.fullmatch(value):
        raise ApiError(404, f"no access request {value[:64]!r}", "id")
    return value


class AccessRequests(_Handler):
    async def get(self) -> None:
        """The requests held for a decision (every worker's, on the lead)."""
        self.reply(await list_requests(self.state))


class AccessRequestRoute(_Handler):
    async def get(self, request_id: str) -> None:
        found = await show_request(self.state, _request_id(request_id))
        if found is None:
            raise ApiError(404, f"no access request {request_id!r}", "id")
        self.reply(found)


async def decide_request(
    state: AdminState, request_id: str, verb: str, ask: AccessDecision
) -> dict[str, Any]:
    """Approve or deny a held request as an operator asks (the API's route and the console's
    buttons both come here); SettleError when it cannot be taken. In a fleet, a request no
    worker here holds is handed to the gateway that holds it (proxy/approvals/fleet_inbox.py)."""
    try:
        return await decide_here(state, request_id, verb, ask)
    except SettleError as e:
        if e.status != 404 or state.fleet_inbox is None:
            raise
    fields = ask.model_dump(mode="json", exclude_defaults=True)
    return await state.fleet_inbox.decide_remote(request_id, verb, fields)


async def decide_here(state: AdminState, request_id: str, verb: str, ask: AccessDecision) -> dict[str, Any]:
    """Approve or deny a request this gateway's workers hold (a fleet's holder applies a
    decision handed over from another gateway here too); SettleError when it cannot be taken."""
    approving = verb == "approve"
    if approving and state.role.lead:
        return await approve(
            desk(state, lambda: _reload(state, "grant")),
            request_id,
            by=ask.by,
            reason=ask.reason,
            scope=ask.scope,
            ttl_seconds=ask.ttl_seconds,
            any_arguments=ask.any_arguments,
            max_uses=ask.max_uses,
            expires_at=ask.expires_at.timestamp() if ask.expires_at is not None else None,
        )
    widened = ask.scope is not None or ask.ttl_seconds is not None or ask.any_arguments
    widened = widened or ask.max_uses is not None or ask.expires_at is not None
    if not approving and widened:
        raise SettleError(
            400, "scope, ttl_seconds, expires_at, max_uses and any_arguments go with approve only"
        )
    return await settle_request(state, request_id, approve=approving, by=ask.by, reason=ask.reason)


class AccessRequestDecision(_Handler):
    async def post(self, request_id: str, verb: str) -> None:
        """Approve or deny a held request (scope `once`: this request only)."""
        ask = self.parse(AccessDecision)
        try:
            settled = await decide_request(self.state, _request_id(request_id), verb, ask)
        except SettleError as e:
            raise ApiError(e.status, e.message, "id") from None
        log.info("admin.access_request_decided", id=request_id, decision=verb, by=ask.by)
        self.reply(settled)


class GrantRevoke(BaseModel):
    """`POST /v1/grants/{id}/revoke` body: who withdraws it (optional)."""

    model_config = ConfigDict(extra="forbid")

    by: Annotated[str, Field(min_length=1, max_length=200)] | None = None


class GrantsRoute(_Handler):
    async def get(self) -> None:
        """The grants in force (the gateway's and the tenants' grants files'), with their uses."""
        self.reply(await list_grants(self.state.grants, self.state.ctx))


async def withdraw_grant(state: AdminState, grant_id: str, by: str | None) -> dict[str, Any]:
    """Withdraw a grant as an operator asks (the API and the console); SettleError 404 / 503."""
    return await revoke_grant(desk(state, lambda: _reload(state, "grant")), grant_id, by=by)


class GrantRevokeRoute(_Handler):
    async def post(self, grant_id: str) -> None:
        ask = self.parse(GrantRevoke)
        try:
            revoked = await withdraw_grant(self.state, _request_id(grant_id), ask.by)
        except SettleError as e:
            raise ApiError(e.status, e.message, "id") from None
        log.info("admin.grant_revoked", id=grant_id, by=ask.by)
        self.reply(revoked)


@dataclass(frozen=True, slots=True)
class AdminActions:
    """What the console reads and does (sandgate.proxy.console.actions), through the same
    functions as the routes above: what a click does is what `sandgate requests` does."""

    state: AdminState

    async def requests(self) -> dict[str, Any]:
        return await list_requests(self.state)

    async def status(self) -> dict[str, Any]:
        return await gateway_status(self.state)

    async def readiness(self) -> dict[str, Any]:
        return await readiness(self.state)

    async def decide(self, request_id: str, verb: str, fields: dict[str, Any]) -> dict[str, Any]:
        """SettleError for a refused decision; ValueError naming the field for a bad one."""
        try:
            ask = AccessDecision.model_validate(fields)
        except ValidationError as e:
            err = e.errors(include_url=False, include_input=False)[0]
            raise ValueError(f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        settled = await decide_request(self.state, _request_id_or_404(request_id), verb, ask)
        log.info("admin.access_request_decided", id=request_id, decision=verb, by=ask.by, via="console")
        return settled

    async def grants(self) -> dict[str, Any]:
        return await list_grants(self.state.grants, self.state.ctx)

    async def revoke(self, grant_id: str, by: str | None) -> dict[str, Any]:
        revoked = await withdraw_grant(self.state, _request_id_or_404(grant_id), by)
        log.info("admin.grant_revoked", id=grant_id, by=by, via="console")
        return revoked

    async def explain(self, fields: dict[str, str]) -> dict[str, Any]:
        return await explain_record(self.state.ctx, fields)


def _request_id_or_404(value: str) -> str:
    if not _REQUEST_ID.fullmatch(value):
        raise SettleError(404, f"no access request or grant {value[:64]!r}")
    return value


class InternalGrantsRefresh(_Handler):
    """A peer: read the grants store again now (the lead changed it)."""

    async def post(self) -> None:
        if self.state.grants is not None:
            try:
                await self.state.grants.refresh(force=True)
            except GrantStoreError as e:
                raise ApiError(503, str(e)) from None
        self.reply({"ok": True})


class ReloadAsk(BaseModel):
    """`POST /internal/v1/reload` body (the lead to a peer)."""

    model_config = ConfigDict(extra="forbid")

    what: Literal["policy", "registry"]
    trigger: Annotated[str, Field(min_length=1, max_length=64)]
    # A change every worker saw itself (files on disk, SIGHUP): load only if not done yet.
    if_changed: bool = False


def make_app(
    state: AdminState,
    token: Secret | None,
    *,
    require_token: bool,
    private: bool = False,
    extra: Sequence[Rule] = (),
) -> Application:
    """The admin API for one transport (TCP requires the token; the unix socket accepts it).

    `private`: a peer worker's socket: reads of this worker and the lead's internal calls.
    `extra`: routes served before the API's own (the console, with its own login)."""
    kw = {"state": state, "token": token, "require_token": require_token}
    segment = r"([^/]+)"
    if private:
        return Application(
            [
                (r"/healthz", Health, kw),
                (r"/readyz", Ready, kw),
                (r"/metrics", Metrics, kw),
                (r"/v1/status", Status, kw),
                (RELOAD_PATH, InternalReload, kw),
                (CREDENTIALS_PATH, InternalCredentials, kw),
                (WORKER_PATH, InternalWorker, kw),
                (METRICS_PATH, InternalMetrics, kw),
                (INTERNAL_PATH, AccessRequests, kw),
                (rf"{INTERNAL_PATH}/{segment}", AccessRequestRoute, kw),
                (rf"{INTERNAL_PATH}/{segment}/(approve|deny)", AccessRequestDecision, kw),
                (GRANTS_REFRESH_PATH, InternalGrantsRefresh, kw),
                (r"/v1/.*", LeadOnly, kw),
            ],
            default_handler_class=NotFound,
            default_handler_args=kw,
            log_function=_log_request,
        )
    return Application(
        [
            *extra,
            (r"/healthz", Health, kw),
            (r"/readyz", Ready, kw),
            (r"/metrics", Metrics, kw),
            (r"/v1/status", Status, kw),
            (r"/v1/policy/reload", PolicyReload, kw),
            (r"/v1/listeners/sandbox", SandboxListenersRoute, kw),
            (r"/v1/sandboxes", Sandboxes, kw),
            (rf"/v1/sandboxes/{segment}", Sandbox, kw),
            (r"/v1/credentials", Credentials, kw),
            (rf"/v1/credentials/{segment}/{segment}", Credential, kw),
            (r"/v1/access-requests", AccessRequests, kw),
            (rf"/v1/access-requests/{segment}", AccessRequestRoute, kw),
            (rf"/v1/access-requests/{segment}/(approve|deny)", AccessRequestDecision, kw),
            (r"/v1/grants", GrantsRoute, kw),
            (rf"/v1/grants/{segment}/revoke", GrantRevokeRoute, kw),
        ],
        default_handler_class=NotFound,
        default_handler_args=kw,
        log_function=_log_request,
    )


def _log_request(handler: RequestHandler) -> None:
    # Method, path and status only: no query, no headers, no body.
    log.debug(
        "admin.request",
        method=handler.request.method,
        path=handler.request.path,
        status=handler.get_status(),
        ms=round(1000 * handler.request.request_time(), 2),
    )
