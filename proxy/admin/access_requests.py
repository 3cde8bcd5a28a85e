"""The access requests the gateway holds (`ask` rules), for the admin API: each worker holds its
own; the lead answers for the gateway, merging its peers' lists and taking a decision to the
worker that holds the request (proxy/admin/fanout.py, proxy/admin/peers.py).

An approval's scope (`once`, `sandbox`, `tenant`) and the grants it adds are the lead's too:
it writes the grant (the gateway's grants store, or the tenant's grants file and a reload
every worker confirms) and tells its peers to read the store again before it answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError

from sandgate.policy.model.grants import Grant, GrantEntry, exact_path_problem
from sandgate.proxy.admin.peers import READ_TIMEOUT, WRITE_TIMEOUT
from sandgate.proxy.admin.state import AdminState
from sandgate.proxy.approvals import DecideError
from sandgate.proxy.approvals.grants import GrantStoreError, grant_record
from sandgate.proxy.approvals.grants_file import GrantsFileError, add_grant, grants_path, remove_grants
from sandgate.proxy.approvals.store import asked_for

__all__ = [
    "GRANTS_REFRESH_PATH",
    "INTERNAL_PATH",
    "approve_request",
    "decide_request",
    "grant_for",
    "list_grants",
    "list_requests",
    "revoke_grant",
    "show_request",
    "sweep_file_grants",
]

log = structlog.get_logger("sandgate.admin")

# A peer's own access requests (served on its private socket only).
INTERNAL_PATH = "/internal/v1/access-requests"


def _local(state: AdminState) -> list[dict[str, Any]]:
    if state.approvals is None:
        return []
    return [{**r.view(), "worker": state.role.index} for r in state.approvals.listing()]


async def list_requests(state: AdminState) -> dict[str, Any]:
    """The open access requests of every worker (oldest first), and the workers that did not answer."""
    requests = _local(state)
    unanswered: list[dict[str, Any]] = []
    if state.peers is not None:
        for a in await state.peers.call("GET", INTERNAL_PATH, within=READ_TIMEOUT):
            listed = a.body.get("requests")
            if a.ok and isinstance(listed, list):
                requests.extend(r for r in listed if isinstance(r, dict))
            else:
                unanswered.append(a.view())
    requests.sort(key=lambda r: str(r.get("id")))
    out: dict[str, Any] = {"requests": requests}
    if unanswered:
        out["unanswered"] = unanswered
    return out


async def show_request(state: AdminState, request_id: str) -> dict[str, Any] | None:
    """One access request, from whichever worker holds (or held) it; None when none does."""
    if state.approvals is not None:
        found = state.approvals.get(request_id)
        if found is not None:
            return {**found.view(), "worker": state.role.index}
    if state.peers is not None:
        for a in await state.peers.call("GET", f"{INTERNAL_PATH}/{request_id}", within=READ_TIMEOUT):
            if a.ok:
                return a.body
    return None


async def decide_request(
    state: AdminState, request_id: str, *, approve: bool, by: str | None, reason: str | None
) -> dict[str, Any]:
    """Approve or deny a request on the worker that holds it; DecideError 404 / 409 (or 503
    when a worker that may hold it did not answer)."""
    if state.approvals is not None:
        try:
            decided = state.approvals.decide(request_id, approve=approve, by=by, reason=reason)
            return {**decided.view(), "worker": state.role.index}
        except DecideError as e:
            if e.status != 404 or state.peers is None:
                raise
    if state.peers is None:
        raise DecideError(404, f"no access request {request_id!r}")
    verb = "approve" if approve else "deny"
    answers = await state.peers.call(
        "POST",
        f"{INTERNAL_PATH}/{request_id}/{verb}",
        within=WRITE_TIMEOUT,
        json={"by": by, "reason": reason},
    )
    for a in answers:
        if a.ok:
            return a.body
        if a.status == 409:
            raise DecideError(
                409, str(a.body.get("error") or f"access request {request_id!r} is already decided")
            )
    if any(a.status != 404 for a in answers):
        missing = "; ".join(a.error or f"worker {a.index}" for a in answers if a.status != 404)
        raise DecideError(503, f"no worker that answered holds {request_id!r}; not answered: {missing}")
    raise DecideError(404, f"no access request {request_id!r}")


# -- approval with a scope, and grants ----------------------------------------------------

# A peer puts the gateway's grants store in force again at once (the lead changed it).
GRANTS_REFRESH_PATH = "/internal/v1/grants/refresh"

SCOPES = ("once", "sandbox", "tenant")
OPEN_STATES = frozenset({"held", "pending", "client_gone"})

Reload = Callable[[], Awaitable[object]]


async def approve_request(
    state: AdminState,
    request_id: str,
    *,
    by: str | None,
    reason: str | None,
    scope: str | None,
    ttl_seconds: float | None,
    reload: Reload,
) -> dict[str, Any]:
    """Approve an access request with a scope (DecideError 400 / 404 / 409 / 503).

    `once` (a held request's default) releases it only. `sandbox` (a proposal's default) and
    `tenant` also add a grant, in force before the request is released: the next matching
    request of that sandbox (or tenant) is allowed without asking. A proposal holds nothing
    to release: `once` is refused for it.
    """
    view = await show_request(state, request_id)
    if view is None:
        raise DecideError(404, f"no access request {request_id!r}")
    kind = str(view.get("kind") or "held")
    chosen = scope or ("sandbox" if kind == "proposal" else "once")
    if chosen not in SCOPES:
        raise DecideError(400, f"scope {chosen!r}: use once, sandbox or tenant")
    if chosen == "once":
        if kind == "proposal":
            raise DecideError(
                400,
                "a proposal holds no request to release once: approve it with scope sandbox "
                "(the default for proposals) or tenant",
            )
        if ttl_seconds is not None:
            raise DecideError(400, "a TTL goes with scope sandbox or tenant (once ends with the request)")
        decided = await decide_request(state, request_id, approve=True, by=by, reason=reason)
        return {**decided, "scope": chosen}
    if view.get("state") not in OPEN_STATES:
        raise DecideError(409, f"access request {request_id!r} is already {view.get('state')}")
    grant = grant_for(state, view, chosen, by=by, reason=reason, ttl_seconds=ttl_seconds)
    # The grant first: in force before the held request is released, so what the agent sends
    # next is allowed; taken back when the request can no longer be approved.
    where = await _store(state, grant, reload)
    try:
        decided = await decide_request(state, request_id, approve=True, by=by, reason=reason)
    except DecideError:
        await _unstore(state, grant, reload, by=by)
        raise
    return {**decided, "scope": chosen, "grant": {**grant.view(), "origin": where}}


def grant_for(
    state: AdminState,
    view: dict[str, Any],
    scope: str,
    *,
    by: str | None,
    reason: str | None,
    ttl_seconds: float | None,
) -> Grant:
    """The grant an approval adds: exactly what the request asked for (DecideError 400 when
    that cannot be written as a grant)."""
    book = state.grants
    if book is None:
        raise DecideError(501, "this gateway keeps no grants")
    methods, paths = asked_for(view)
    if view.get("paths") is None and paths is not None:
        # A held request's path, without its query (already redacted): matched exactly.
        problem = exact_path_problem(paths[0])
        if problem is not None:
            raise DecideError(400, problem)
    try:
        entry = GrantEntry(
            id=str(view["id"]),
            host=str(view["host"]),
            port=int(view["port"]),
            methods=methods,
            paths=paths,
        )
    except (ValidationError, ValueError, KeyError) as e:
        raise DecideError(400, f"this request cannot be granted beyond once: {_first_error(e)}") from None
    now = time.time()
    ttl = ttl_seconds if ttl_seconds is not None else (book.default_ttl if scope == "sandbox" else None)
    if ttl is not None:
        ttl = min(ttl, book.max_ttl)
    return Grant(
        id=entry.id,
        tenant=str(view["tenant"]),
        sandbox=str(view["sandbox"]) if scope == "sandbox" else None,
        host=entry.host,
        port=entry.port,
        methods=frozenset(entry.methods) if entry.methods is not None else None,
        paths=tuple(entry.paths) if entry.paths is not None else None,
        expires=now + ttl if ttl is not None else None,
        by=by,
        at=now,
        reason=reason,
    )


def _first_error(e: Exception) -> str:
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        return f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}"
    return str(e)


def _in_file(state: AdminState, grant: Grant) -> bool:
    """Whether the grant goes to the tenant's grants file (tenant scope, no fleet redis)."""
    book = state.grants
    return grant.sandbox is None and (book is None or book.store.where != "redis")


async def _store(state: AdminState, grant: Grant, reload: Reload) -> str:
    """Put the grant in force on every worker; where it is kept."""
    book = state.grants
    assert book is not None
    try:
        if _in_file(state, grant):
            tenant = state.ctx.policy.tenant(grant.tenant)
            if tenant is None:
                raise DecideError(409, f"tenant {grant.tenant!r} is not defined any more")
            path = grants_path(tenant.source, grant.tenant)
            await asyncio.to_thread(add_grant, path, grant)
            await _reload_for(path, reload)
            await state.ctx.audit.emit(grant_record(grant, "made", where=str(path), by=grant.by))
            return str(path)
        await book.add(grant)
    except (GrantStoreError, GrantsFileError) as e:
        raise DecideError(503, f"the grant could not be stored, nothing was approved: {e}") from None
    await _refresh_peers(state)
    return book.store.where


async def _unstore(state: AdminState, grant: Grant, reload: Reload, *, by: str | None) -> None:
    """Take back a grant whose request could not be approved after all."""
    try:
        await revoke_grant(state, grant.id, by=by, reload=reload)
    except DecideError:
        log.warning("grant.not_taken_back", id=grant.id)


async def _reload_for(path: Path, reload: Reload) -> None:
    try:
        await reload()
    except Exception as e:
        message = getattr(e, "message", None) or str(e)
        raise GrantsFileError(f"{path} was written, but the policy did not reload: {message}") from None


async def _refresh_peers(state: AdminState) -> None:
    """Every peer reads the grants store again now (each also looks twice a second)."""
    if state.peers is None:
        return
    answers = await state.peers.call("POST", GRANTS_REFRESH_PATH, within=WRITE_TIMEOUT)
    missing = [a.error or f"worker {a.index}" for a in answers if not a.ok]
    if missing:
        log.warning("grants.refresh_not_confirmed", workers="; ".join(missing))


def list_grants(state: AdminState) -> dict[str, Any]:
    """Every grant in force: the gateway's (sandbox scope; tenant scope in a fleet) and the
    tenants' grants files'; expired ones are marked (they allow nothing)."""
    now = time.time()
    out: list[dict[str, Any]] = []
    dynamic = list(state.grants.grants) if state.grants is not None else []
    files = [g for t in state.ctx.policy.tenants.values() for g in t.grants]
    for g in [*dynamic, *files]:
        out.append({**g.view(), "expired": not g.live(now)})
    out.sort(key=lambda v: (str(v["tenant"]), str(v["id"])))
    return {"grants": out}


async def sweep_file_grants(state: AdminState, reload: Reload) -> list[Grant]:
    """The lead: remove expired grants from the tenants' grants files (they allow nothing
    already), reload, and record each as expired; those removed."""
    now = time.time()
    gone: list[tuple[Path, Grant]] = []
    for tenant in list(state.ctx.policy.tenants.values()):
        expired = [g.id for g in tenant.grants if not g.live(now)]
        if not expired:
            continue
        path = grants_path(tenant.source, tenant.name)
        try:
            removed = await asyncio.to_thread(remove_grants, path, tenant.name, expired)
        except GrantsFileError as e:
            log.warning("grants.file_sweep_failed", file=str(path), error=str(e))
            continue
        gone.extend((path, g) for g in removed)
    if not gone:
        return []
    try:
        await reload()
    finally:
        for where, g in gone:
            await state.ctx.audit.emit(grant_record(g, "expired", where=str(where), by=None))
    return [g for _, g in gone]


async def revoke_grant(state: AdminState, grant_id: str, *, by: str | None, reload: Reload) -> dict[str, Any]:
    """Withdraw a grant (DecideError 404 when there is none by that id)."""
    book = state.grants
    try:
        if book is not None and book.grants.get(grant_id) is not None:
            removed = await book.revoke(grant_id, by)
            if removed is not None:
                await _refresh_peers(state)
                return {**removed.view(), "revoked": True}
        for tenant in state.ctx.policy.tenants.values():
            if tenant.grants.get(grant_id) is None:
                continue
            path = grants_path(tenant.source, tenant.name)
            gone = await asyncio.to_thread(remove_grants, path, tenant.name, [grant_id])
            await _reload_for(path, reload)
            for g in gone:
                await state.ctx.audit.emit(grant_record(g, "revoked", where=str(path), by=by))
                return {**g.view(), "revoked": True}
    except (GrantStoreError, GrantsFileError) as e:
        raise DecideError(503, f"the grant could not be revoked: {e}") from None
    raise DecideError(404, f"no grant {grant_id!r}")
