"""The console's pages and forms: login, the approval inbox, grants, the overview, the live
decisions page (its stream is sandgate.proxy.console.stream) and a record's explanation, the
sandboxes page and its suggested rules, and health.

Forms post back here and answer with a redirect (303) to the page, so a browser without
script still works and a reload never repeats a decision. What a button does is the admin
API's own operation (sandgate.proxy.console.actions): the same checks, the same records."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import structlog
from tornado.web import HTTPError

from sandgate.proxy.approvals.store import SettleError
from sandgate.proxy.audit.query import AuditInputError
from sandgate.proxy.console.base import COOKIE, PREFIX, ConsoleHandler
from sandgate.proxy.console.charts import column_chart, row_chart
from sandgate.proxy.console.explain import FIELDS
from sandgate.proxy.console.overview import WINDOWS, read_overview
from sandgate.proxy.console.suggest import MIN_COUNT, WINDOW, read_suggestion
from sandgate.proxy.redis.outage import REDIS_OUTAGE

__all__ = [
    "Decide",
    "DecisionsPage",
    "ExplainRecord",
    "Grants",
    "Health",
    "Home",
    "Inbox",
    "Login",
    "Logout",
    "OverviewPage",
    "RequestIds",
    "Revoke",
    "Sandboxes",
    "Suggest",
]

log = structlog.get_logger("sandgate.console")

# Who the trail and the grants name as the deciding operator.
BY = "console"
FILTERS = ("tenant", "sandbox", "decision", "reason", "host")


class Home(ConsoleHandler):
    def get(self) -> None:
        self.redirect(f"{PREFIX}/overview", status=303)


class Login(ConsoleHandler):
    """The admin token in, a session cookie out; failed attempts limited per address."""

    login_required = False

    def get(self) -> None:
        self.page("login.html", error=None)

    def post(self) -> None:
        address = self.request.remote_ip or "-"
        limiter = self.console.limiter
        if not limiter.allowed(address):
            log.warning("console.login_limited", client=address)
            self.set_status(429)
            self.page("login.html", error="too many failed logins: wait a minute")
            return
        if not self.console.sessions.token_matches(self.get_body_argument("token", "")):
            limiter.failed(address)
            log.warning("console.login_failed", client=address)
            self.set_status(401)
            self.page("login.html", error="wrong token")
            return
        session = self.console.sessions.open()
        self.set_cookie(
            COOKIE,
            session.id,
            path=PREFIX,
            httponly=True,
            secure=self.tls,
            samesite="Strict",
            max_age=int(self.console.config.session_ttl_seconds),
        )
        log.info("console.login", client=address)
        self.redirect(f"{PREFIX}/overview", status=303)


class Logout(ConsoleHandler):
    def post(self) -> None:
        self.console.sessions.close(self.get_cookie(COOKIE))
        self.clear_cookie(COOKIE, path=PREFIX)
        self.redirect(f"{PREFIX}/login", status=303)


def _waited(created: object, now: datetime) -> str:
    """How long a request has waited, for people: `42 s`, `3 min 5 s`."""
    try:
        seconds = int((now - datetime.fromisoformat(str(created))).total_seconds())
    except ValueError:
        return "?"
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min {seconds % 60} s"


class Inbox(ConsoleHandler):
    async def get(self) -> None:
        listed = await self.console.actions.requests()
        now = datetime.now(UTC)
        requests = [{**r, "waited": _waited(r.get("created"), now)} for r in listed.get("requests", [])]
        self.page(
            "inbox.html",
            requests=requests,
            unanswered=listed.get("unanswered", []),
            done=self.get_query_argument("done", None),
            done_id=self.get_query_argument("id", None),
        )


class RequestIds(ConsoleHandler):
    """The open requests' ids, for the inbox page to notice a change and reload."""

    api = True

    async def get(self) -> None:
        listed = await self.console.actions.requests()
        self.set_header("Content-Type", "application/json")
        self.finish({"ids": [str(r.get("id")) for r in listed.get("requests", [])]})


def _field(handler: ConsoleHandler, name: str) -> str | None:
    """A form field, stripped; None when empty."""
    value = handler.get_body_argument(name, "").strip()
    return value or None


class Decide(ConsoleHandler):
    async def post(self, request_id: str, verb: str) -> None:
        """Approve (once, for the sandbox, for the tenant) or deny one request."""
        fields: dict[str, Any] = {"by": BY, "reason": _field(self, "reason")}
        if verb == "approve":
            scope = self.get_body_argument("scope", "once")
            fields["scope"] = scope
            if scope != "once":
                fields["ttl_seconds"] = _field(self, "ttl_seconds")
                fields["max_uses"] = _field(self, "max_uses")
        try:
            await self.console.actions.decide(request_id, verb, {k: v for k, v in fields.items() if v})
        except SettleError as e:
            self.refuse(e.status, e.message)
            return
        except ValueError as e:
            self.refuse(422, str(e))
            return
        self.redirect(
            f"{PREFIX}/inbox?done={'approved' if verb == 'approve' else 'denied'}&id={request_id}", status=303
        )


class Grants(ConsoleHandler):
    async def get(self) -> None:
        listed = await self.console.actions.grants()
        now = datetime.now(UTC).timestamp()
        grants = [{**g, "left": _left(g.get("expires"), now)} for g in listed.get("grants", [])]
        self.page("grants.html", grants=grants, done=self.get_query_argument("done", None))


def _left(expires: object, now: float) -> str:
    """A grant's time left, for people."""
    if expires is None:
        return "until revoked"
    try:
        end = datetime.fromisoformat(str(expires)).timestamp()
    except ValueError:
        return str(expires)
    seconds = int(end - now)
    if seconds <= 0:
        return "expired"
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min"


class Revoke(ConsoleHandler):
    async def post(self, grant_id: str) -> None:
        try:
            await self.console.actions.revoke(grant_id, BY)
        except SettleError as e:
            self.refuse(e.status, e.message)
            return
        self.redirect(f"{PREFIX}/grants?done={grant_id}", status=303)


class OverviewPage(ConsoleHandler):
    async def get(self) -> None:
        window = self.get_query_argument("window", "15m")
        if window not in WINDOWS:
            raise HTTPError(400, reason=f"window: one of {', '.join(WINDOWS)}")
        source = self.console.trail.open()
        figures = await asyncio.to_thread(read_overview, source, window, datetime.now(UTC))
        waiting = [
            r
            for r in (await self.console.actions.requests()).get("requests", [])
            if r.get("state") in ("held", "pending")
        ]
        rate = column_chart(
            [("allow", figures.per_second(figures.allowed)), ("deny", figures.per_second(figures.denied))],
            title=f"decisions per second over {window}",
            unit="decisions/s",
            start=f"-{window}",
        )
        reasons = row_chart(figures.denial_reasons, title="denials by reason")
        tenants = [
            (
                t["tenant"] or "(no identity)",
                row_chart(
                    [(h["host"], h["count"]) for h in t["top_denied_hosts"]],
                    title=f"top denied hosts of {t['tenant']}",
                ),
            )
            for t in figures.tenants
        ]
        self.page(
            "overview.html",
            windows=list(WINDOWS),
            window=window,
            figures=figures,
            waiting=len(waiting),
            rate_svg=rate,
            reasons_svg=reasons,
            tenant_svgs=tenants,
            fleet=self.console.trail.fleet,
        )


class DecisionsPage(ConsoleHandler):
    def get(self) -> None:
        filters = {name: self.get_query_argument(name, "") for name in FILTERS}
        self.page(
            "decisions.html",
            filters=filters,
            max_clients=self.console.feed.max_clients,
            fleet=self.console.trail.fleet,
        )


class ExplainRecord(ConsoleHandler):
    """`policy explain` of the request a live decision's record describes, as JSON for the
    decisions page (which shows it as text)."""

    api = True

    async def get(self) -> None:
        fields = {name: self.get_query_argument(name, "")[:2048] for name in FIELDS}
        self.set_header("Content-Type", "application/json")
        try:
            explained = await self.console.actions.explain(fields)
        except ValueError as e:
            # In the body, never the status line: the message can quote the record's host.
            self.set_status(422)
            self.finish({"error": str(e)[:300]})
            return
        self.finish(explained)


class Health(ConsoleHandler):
    """Readiness, workers, the audit queue, the last reload and the console's own streams."""

    async def get(self) -> None:
        ready = await self.console.actions.readiness()
        status = await self.console.actions.status()
        feed = self.console.feed
        trail = self.console.trail
        members, members_error = None, None
        if trail.members is not None:
            try:
                members = await asyncio.to_thread(trail.members)
            except AuditInputError as e:
                members_error = str(e)
        self.page(
            "health.html",
            ready=ready,
            status=status,
            streams={"open": feed.clients, "max": feed.max_clients, "dropped": feed.dropped},
            trail=trail,
            members=members,
            members_error=members_error,
            redis=_redis_state() if "redis" in ready["checks"] else None,
            sinks=status.get("audit_sinks"),
        )


def _redis_state() -> dict[str, Any]:
    """Redis as this process last found it (sandgate.proxy.redis.outage)."""
    since = REDIS_OUTAGE.since
    return {
        "down": REDIS_OUTAGE.down,
        "since": datetime.fromtimestamp(since, UTC).isoformat(timespec="seconds") if since else None,
        "outages": REDIS_OUTAGE.outages,
    }


class Sandboxes(ConsoleHandler):
    """Tenants and sandboxes served, the policy version, and tenant files that did not load."""

    async def get(self) -> None:
        self.page("sandboxes.html", status=await self.console.actions.status())


class Suggest(ConsoleHandler):
    """`audit suggest` for one sandbox, with a button that copies it."""

    async def get(self) -> None:
        sandbox = self.get_query_argument("sandbox", "")
        status = await self.console.actions.status()
        known = {s["id"]: s for s in status["sandbox_list"]}
        if sandbox not in known:
            raise HTTPError(404, reason="no such sandbox")
        tenant = known[sandbox].get("tenant")
        source = self.console.trail.open()
        text, error = None, None
        try:
            text = await asyncio.to_thread(read_suggestion, source, sandbox, tenant, datetime.now(UTC))
        except AuditInputError as e:
            error = str(e)
        self.page(
            "suggest.html",
            sandbox=sandbox,
            tenant=tenant,
            text=text,
            error=error,
            hours=int(WINDOW.total_seconds() // 3600),
            min_count=MIN_COUNT,
            fleet=self.console.trail.fleet,
        )
