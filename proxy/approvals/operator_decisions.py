"""An operator's decision on an access request: approve it with a scope (`once`, `sandbox`,
`tenant`), the grant a wider approval writes, and grants withdrawn or expired.

The admin API routes the operator here (proxy/admin/access_requests.py) and hands over the
gateway's workers as `Workers`: it finds a request on whichever worker holds it, settles it
there, and tells every worker to read the grants store again. Grants are the lead's to write:
in the gateway's grants store, or in the tenant's grants file followed by a reload that every
worker confirms; peers are told before the approval answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from pydantic import ValidationError

from sandgate.policy.model.grants import Grant, GrantEntry, exact_path_problem
from sandgate.proxy.approvals.grants import GrantBook, GrantStoreError, grant_record
from sandgate.proxy.approvals.grants_file import GrantsFileError, add_grant, grants_path, remove_grants
from sandgate.proxy.approvals.store import SettleError, asked_for

if TYPE_CHECKING:
    from sandgate.proxy.context import GatewayContext

__all__ = [
    "OPEN_STATES",
    "SCOPES",
    "OperatorDesk",
    "Reload",
    "Workers",
    "approve",
    "grant_for",
    "list_grants",
    "revoke_grant",
    "sweep_file_grants",
]

log = structlog.get_logger("sandgate.admin")

SCOPES = ("once", "sandbox", "tenant")
OPEN_STATES = frozenset({"held", "pending", "client_gone"})

Reload = Callable[[], Awaitable[object]]


class Workers(Protocol):
    """The gateway's workers as an operator's decision reaches them (the admin API fans out)."""

    async def find(self, request_id: str) -> dict[str, Any] | None:
        """The request as the worker that holds (or held) it shows it; None when none does."""
        ...

    async def settle(
        self, request_id: str, *, approve: bool, by: str | None, reason: str | None
    ) -> dict[str, Any]:
        """Approve or deny the request on the worker that holds it (SettleError 404 / 409 / 503)."""
        ...

    async def refresh_grants(self) -> None:
        """Every other worker reads the grants store again now."""
        ...


@dataclass(frozen=True, slots=True)
class OperatorDesk:
    """What an operator's decision acts on: the workers, the gateway's grants, the policy in
    force and its trail (through the gateway context), and how to reload the policy."""

    workers: Workers
    grants: GrantBook | None
    ctx: GatewayContext
    reload: Reload


async def approve(
    desk: OperatorDesk,
    request_id: str,
    *,
    by: str | None,
    reason: str | None,
    scope: str | None,
    ttl_seconds: float | None,
    any_arguments: bool = False,
    max_uses: int | None = None,
    expires_at: float | None = None,
) -> dict[str, Any]:
    """Approve an access request with a scope (SettleError 400 / 404 / 409 / 503).

    `once` (a held request's default) releases it only. `sandbox` (a proposal's default) and
    `tenant` also add a grant, in force before the request is released: the next matching
    request of that sandbox (or tenant) is allowed without asking. A proposal holds nothing
    to release: `once` is refused for it. A held tool call's grant is a tool grant: its tool,
    and its exact arguments (their digest) unless `any_arguments`. A grant ends at
    `expires_at` (epoch seconds) or after `ttl_seconds`, not both, and allows at most
    `max_uses` requests (tool calls) when given.
    """
    view = await desk.workers.find(request_id)
    if view is None:
        raise SettleError(404, f"no access request {request_id!r}")
    kind = str(view.get("kind") or "held")
    chosen = scope or ("sandbox" if kind == "proposal" else "once")
    if chosen not in SCOPES:
        raise SettleError(400, f"scope {chosen!r}: use once, sandbox or tenant")
    if chosen == "once":
        if kind == "proposal":
            raise SettleError(
                400,
                "a proposal holds no request to release once: approve it with scope sandbox "
                "(the default for proposals) or tenant",
            )
        if ttl_seconds is not None or expires_at is not None:
            raise SettleError(
                400, "a TTL or an end goes with scope sandbox or tenant (once ends with the request)"
            )
        if max_uses is not None:
            raise SettleError(400, "max_uses goes with scope sandbox or tenant (once is one use)")
        if any_arguments:
            raise SettleError(400, "any_arguments widens a grant: it goes with scope sandbox or tenant")
        settled = await desk.workers.settle(request_id, approve=True, by=by, reason=reason)
        return {**settled, "scope": chosen}
    if view.get("state") not in OPEN_STATES:
        raise SettleError(409, f"access request {request_id!r} is already {view.get('state')}")
    grant = grant_for(
        desk.grants,
        view,
        chosen,
        by=by,
        reason=reason,
        ttl_seconds=ttl_seconds,
        any_arguments=any_arguments,
        max_uses=max_uses,
        expires_at=expires_at,
    )
    # The grant first: in force before the held request is released, so what the agent sends
    # next is allowed; taken back when the request can no longer be approved.
    where = await _store(desk, grant)
    try:
        settled = await desk.workers.settle(request_id, approve=True, by=by, reason=reason)
    except SettleError:
        await _unstore(desk, grant, by=by)
        raise
    return {**settled, "scope": chosen, "grant": {**grant.view(), "origin": where}}


def grant_for(
    book: GrantBook | None,
    view: dict[str, Any],
    scope: str,
    *,
    by: str | None,
    reason: str | None,
    ttl_seconds: float | None,
    any_arguments: bool = False,
    max_uses: int | None = None,
    expires_at: float | None = None,
) -> Grant:
    """The grant an approval adds: exactly what the request asked for (SettleError 400 when
    that cannot be written as a grant)."""
    if book is None:
        raise SettleError(501, "this gateway keeps no grants")
    tool, digest = _tool_scope(view, any_arguments)
    methods, paths = asked_for(view)
    if view.get("paths") is None and paths is not None:
        # A held request's path, without its query (already redacted): matched exactly.
        problem = exact_path_problem(paths[0])
        if problem is not None:
            raise SettleError(400, problem)
    try:
        entry = GrantEntry(
            id=str(view["id"]),
            host=str(view["host"]),
            port=int(view["port"]),
            methods=methods,
            paths=paths,
            tool=tool,
            arguments_sha256=digest,
            max_uses=max_uses,
        )
    except (ValidationError, ValueError, KeyError) as e:
        raise SettleError(400, f"this request cannot be granted beyond once: {_first_error(e)}") from None
    now = time.time()
    return Grant(
        id=entry.id,
        tenant=str(view["tenant"]),
        sandbox=str(view["sandbox"]) if scope == "sandbox" else None,
        host=entry.host,
        port=entry.port,
        methods=frozenset(entry.methods) if entry.methods is not None else None,
        paths=tuple(entry.paths) if entry.paths is not None else None,
        expires=_expiry(book, scope, now, ttl_seconds, expires_at),
        by=by,
        at=now,
        reason=reason,
        max_uses=entry.max_uses,
        **entry.tool_scope(),
    )


def _expiry(
    book: GrantBook, scope: str, now: float, ttl_seconds: float | None, expires_at: float | None
) -> float | None:
    """When a grant ends: at `expires_at`, or after `ttl_seconds` (a sandbox grant's default
    TTL when neither), capped by the maximum TTL; None: until revoked (tenant scope)."""
    if ttl_seconds is not None and expires_at is not None:
        raise SettleError(400, "give a TTL or an end time, not both")
    if expires_at is not None:
        if expires_at <= now:
            raise SettleError(400, "the end time is already past")
        return min(expires_at, now + book.max_ttl)
    ttl = ttl_seconds if ttl_seconds is not None else (book.default_ttl if scope == "sandbox" else None)
    return now + min(ttl, book.max_ttl) if ttl is not None else None


def _tool_scope(view: dict[str, Any], any_arguments: bool) -> tuple[str | None, str | None]:
    """A held tool call's grant scope: (its tool, its arguments' digest; None with
    `any_arguments`); (None, None) for any other request. SettleError 400 when it has none."""
    calls = view.get("tool_calls") or []
    if not calls:
        if any_arguments:
            raise SettleError(400, "any_arguments goes with a held tool call; this request is none")
        return None, None
    if len(calls) > 1:
        # One approval makes one grant, and a grant names one tool.
        raise SettleError(400, f"a batch of {len(calls)} tool calls that ask: approve it once")
    call = calls[0]
    return str(call["tool"]), None if any_arguments else str(call["arguments_sha256"])


def _first_error(e: Exception) -> str:
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        return f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}"
    return str(e)


def _in_file(book: GrantBook | None, grant: Grant) -> bool:
    """Whether the grant goes to the tenant's grants file (tenant scope, no fleet redis)."""
    return grant.sandbox is None and (book is None or book.store.where != "redis")


async def _store(desk: OperatorDesk, grant: Grant) -> str:
    """Put the grant in force on every worker; where it is kept."""
    book = desk.grants
    assert book is not None
    try:
        if _in_file(book, grant):
            tenant = desk.ctx.policy.tenant(grant.tenant)
            if tenant is None:
                raise SettleError(409, f"tenant {grant.tenant!r} is not defined any more")
            path = grants_path(tenant.source, grant.tenant)
            await asyncio.to_thread(add_grant, path, grant)
            await _reload_for(path, desk.reload)
            await desk.ctx.audit.emit(grant_record(grant, "made", where=str(path), by=grant.by))
            return str(path)
        await book.add(grant)
    except (GrantStoreError, GrantsFileError) as e:
        raise SettleError(503, f"the grant could not be stored, nothing was approved: {e}") from None
    await desk.workers.refresh_grants()
    return book.store.where


async def _unstore(desk: OperatorDesk, grant: Grant, *, by: str | None) -> None:
    """Take back a grant whose request could not be approved after all."""
    try:
        await revoke_grant(desk, grant.id, by=by)
    except SettleError:
        log.warning("grant.not_taken_back", id=grant.id)


async def _reload_for(path: Path, reload: Reload) -> None:
    try:
        await reload()
    except Exception as e:
        message = getattr(e, "message", None) or str(e)
        raise GrantsFileError(f"{path} was written, but the policy did not reload: {message}") from None


async def list_grants(book: GrantBook | None, ctx: GatewayContext) -> dict[str, Any]:
    """Every grant in force: the gateway's (sandbox scope; tenant scope in a fleet) and the
    tenants' grants files'; expired ones are marked (they allow nothing), and a counted
    one shows its uses (`uses`: taken so far, None when the count is out of reach) and
    whether it is exhausted."""
    now = time.time()
    out: list[dict[str, Any]] = []
    dynamic = list(book.grants) if book is not None else []
    files = [g for t in ctx.policy.tenants.values() for g in t.grants]
    counts = await book.uses.used([*dynamic, *files]) if book is not None else None
    for g in [*dynamic, *files]:
        out.append({**g.view(), "expired": not g.live(now), **_uses_view(g, counts)})
    out.sort(key=lambda v: (str(v["tenant"]), str(v["id"])))
    return {"grants": out}


def _uses_view(grant: Grant, counts: dict[str, int] | None) -> dict[str, Any]:
    """A counted grant's uses as listed: taken, left, exhausted (None each: not known)."""
    if grant.max_uses is None:
        return {"uses": None, "uses_left": None, "exhausted": False}
    used = counts.get(grant.id) if counts is not None else None
    if used is None:
        return {"uses": None, "uses_left": None, "exhausted": None}
    left = max(grant.max_uses - used, 0)
    return {"uses": used, "uses_left": left, "exhausted": left == 0}


async def sweep_file_grants(ctx: GatewayContext, reload: Reload) -> list[Grant]:
    """The lead: remove expired grants from the tenants' grants files (they allow nothing
    already), reload, and record each as expired; those removed."""
    now = time.time()
    gone: list[tuple[Path, Grant]] = []
    for tenant in list(ctx.policy.tenants.values()):
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
            await ctx.audit.emit(grant_record(g, "expired", where=str(where), by=None))
    return [g for _, g in gone]


async def _forget(desk: OperatorDesk, grant: Grant) -> None:
    """Drop a withdrawn grant's count of uses."""
    if desk.grants is not None:
        await desk.grants.uses.forget(grant)


async def revoke_grant(desk: OperatorDesk, grant_id: str, *, by: str | None) -> dict[str, Any]:
    """Withdraw a grant (SettleError 404 when there is none by that id)."""
    book = desk.grants
    try:
        if book is not None and book.grants.get(grant_id) is not None:
            removed = await book.revoke(grant_id, by)
            if removed is not None:
                await desk.workers.refresh_grants()
                return {**removed.view(), "revoked": True}
        for tenant in desk.ctx.policy.tenants.values():
            if tenant.grants.get(grant_id) is None:
                continue
            path = grants_path(tenant.source, tenant.name)
            gone = await asyncio.to_thread(remove_grants, path, tenant.name, [grant_id])
            await _reload_for(path, desk.reload)
            for g in gone:
                await desk.ctx.audit.emit(grant_record(g, "revoked", where=str(path), by=by))
                await _forget(desk, g)
                return {**g.view(), "revoked": True}
    except (GrantStoreError, GrantsFileError) as e:
        raise SettleError(503, f"the grant could not be revoked: {e}") from None
    raise SettleError(404, f"no grant {grant_id!r}")
