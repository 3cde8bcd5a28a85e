"""The console's routes, mounted by the admin server on its TCP listener when
`console.enabled` (the config refuses it without `admin.listen` and `admin.token`)."""

from __future__ import annotations

from dataclasses import dataclass

from tornado.routing import Rule
from tornado.web import url

from sandgate.brokers import Secret
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.console.actions import OperatorActions
from sandgate.proxy.console.base import PREFIX, STATIC, ConsoleContext, ConsoleStatic
from sandgate.proxy.console.feed import DecisionFeed
from sandgate.proxy.console.pages import (
    Decide,
    DecisionsPage,
    ExplainRecord,
    Grants,
    Health,
    Home,
    Inbox,
    Login,
    Logout,
    OverviewPage,
    RequestIds,
    Revoke,
    Sandboxes,
    Suggest,
)
from sandgate.proxy.console.sessions import LoginLimiter, SessionBook
from sandgate.proxy.console.stream import DecisionStream
from sandgate.proxy.console.trail import gateway_trail

__all__ = ["Console", "build_console"]


@dataclass(frozen=True, slots=True)
class Console:
    """The console's routes, and its tail of the trail to stop with the server."""

    routes: tuple[Rule, ...]
    feed: DecisionFeed

    def close(self) -> None:
        """Stop the tail and release the trail's readers (the server stops)."""
        self.feed.close()
        self.feed.trail.close()


def build_console(config: GatewayConfig, token: Secret, actions: OperatorActions) -> Console:
    """The console of this gateway: its login is `token` (the admin token)."""
    settings = config.console
    trail = gateway_trail(config)
    feed = DecisionFeed(trail, settings.max_stream_clients)
    context = ConsoleContext(
        config=settings,
        sessions=SessionBook(token, settings.session_ttl_seconds),
        limiter=LoginLimiter(settings.login_attempts_per_minute),
        actions=actions,
        feed=feed,
        trail=trail,
    )
    kw = {"console": context}
    segment = r"([0-9a-f]{12,64})"
    routes = [
        url(rf"{PREFIX}/?", Home, kw),
        url(rf"{PREFIX}/login", Login, kw),
        url(rf"{PREFIX}/logout", Logout, kw),
        url(rf"{PREFIX}/overview", OverviewPage, kw),
        url(rf"{PREFIX}/inbox", Inbox, kw),
        url(rf"{PREFIX}/requests\.json", RequestIds, kw),
        url(rf"{PREFIX}/requests/{segment}/(approve|deny)", Decide, kw),
        url(rf"{PREFIX}/grants", Grants, kw),
        url(rf"{PREFIX}/grants/{segment}/revoke", Revoke, kw),
        url(rf"{PREFIX}/decisions", DecisionsPage, kw),
        url(rf"{PREFIX}/health", Health, kw),
        url(rf"{PREFIX}/sandboxes", Sandboxes, kw),
        url(rf"{PREFIX}/suggest", Suggest, kw),
        url(rf"{PREFIX}/explain\.json", ExplainRecord, kw),
        url(rf"{PREFIX}/decisions/stream", DecisionStream, kw),
        url(rf"{PREFIX}/static/(.+)", ConsoleStatic, {"path": str(STATIC)}),
    ]
    return Console(routes=tuple(routes), feed=feed)
