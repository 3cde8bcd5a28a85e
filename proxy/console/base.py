"""What every console page shares: its security headers, the session check, the CSRF check on
every POST, the page frame and error pages.

The Content-Security-Policy allows nothing inline: every script and style is a file under
/console/static/. Templates autoescape every value (tornado's xhtml_escape); charts are SVG
built with escaped labels (sandgate.proxy.console.charts)."""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog
from tornado.web import HTTPError, RequestHandler, StaticFileHandler

from sandgate.proxy.config import ConsoleConfig
from sandgate.proxy.console.actions import OperatorActions
from sandgate.proxy.console.feed import DecisionFeed
from sandgate.proxy.console.sessions import LoginLimiter, Session, SessionBook, csrf_matches
from sandgate.proxy.console.trail import Trail

__all__ = [
    "COOKIE",
    "CSP",
    "PREFIX",
    "STATIC",
    "TEMPLATES",
    "ConsoleContext",
    "ConsoleHandler",
    "ConsoleStatic",
    "security_headers",
]

log = structlog.get_logger("sandgate.console")

PREFIX = "/console"
COOKIE = "sandgate_console"
CSP = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
TEMPLATES = Path(__file__).resolve().parent / "templates"
STATIC = Path(__file__).resolve().parent / "static"


@dataclass(frozen=True, slots=True)
class ConsoleContext:
    """What the console's pages read and act on."""

    config: ConsoleConfig
    sessions: SessionBook
    limiter: LoginLimiter
    actions: OperatorActions
    feed: DecisionFeed
    # The trail the pages read: the fleet's audit stream with `redis:`, else the audit file.
    trail: Trail


def security_headers(handler: RequestHandler) -> None:
    """The headers every console answer carries."""
    handler.clear_header("Server")
    handler.set_header("Content-Security-Policy", CSP)
    handler.set_header("X-Content-Type-Options", "nosniff")
    handler.set_header("Referrer-Policy", "no-referrer")
    handler.set_header("X-Frame-Options", "DENY")
    handler.set_header("Cross-Origin-Opener-Policy", "same-origin")


class ConsoleStatic(StaticFileHandler):
    """The console's own scripts and styles (no CDN, no build step)."""

    def set_default_headers(self) -> None:
        security_headers(self)


class ConsoleHandler(RequestHandler):
    """A console page: a live session required (else to the login page), CSRF on every POST."""

    login_required = True
    # Read by script, not shown: 401 without a session instead of the login page.
    api = False

    def initialize(self, console: ConsoleContext) -> None:
        self.console = console
        self.session: Session | None = None

    def set_default_headers(self) -> None:
        security_headers(self)
        self.set_header("Cache-Control", "no-store")

    def get_template_path(self) -> str:
        return str(TEMPLATES)

    def prepare(self) -> None:
        self.session = self.console.sessions.find(self.get_cookie(COOKIE))
        if self.request.method not in ("GET", "HEAD"):
            self._check_origin()
        if self.session is None:
            if not self.login_required:
                return
            if self.request.method in ("GET", "HEAD") and not self.api:
                self.redirect(f"{PREFIX}/login", status=303)
                return
            raise HTTPError(401, reason="log in first")
        if self.request.method not in ("GET", "HEAD"):
            offered = self.get_body_argument("_csrf", None) or self.request.headers.get("X-CSRF-Token")
            if not csrf_matches(self.session, offered):
                log.warning("console.csrf_refused", path=self.request.path)
                raise HTTPError(403, reason="missing or wrong CSRF token")

    def _check_origin(self) -> None:
        """A state change from another site's page is refused, whatever it carries (a second
        guard beside the CSRF token and the SameSite cookie). With `Referrer-Policy:
        no-referrer` a browser sends `Origin: null` on the console's own forms: Sec-Fetch-Site
        tells them apart."""
        site = self.request.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            raise HTTPError(403, reason="cross-origin request refused")
        origin = self.request.headers.get("Origin")
        if origin is not None and origin != "null" and urlsplit(origin).netloc != self.request.host:
            raise HTTPError(403, reason="cross-origin request refused")

    @property
    def tls(self) -> bool:
        return self.request.protocol == "https"

    def page(self, template: str, **values: Any) -> None:
        """Render a page in the console's frame."""
        self.render(
            template,
            csrf=self.session.csrf if self.session is not None else "",
            logged_in=self.session is not None,
            prefix=PREFIX,
            **values,
        )

    def refuse(self, status: int, message: str) -> None:
        """Answer a refused action with the error page (the message as text, never in a header)."""
        self.set_status(status)
        self.page("error.html", status=status, message=message)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        reason = self._reason or HTTPStatus(status_code).phrase
        if self.api:
            self.set_header("Content-Type", "application/json")
            self.finish({"error": reason})
            return
        self.render(
            "error.html",
            status=status_code,
            message=reason,
            csrf="",
            logged_in=self.session is not None,
            prefix=PREFIX,
        )
