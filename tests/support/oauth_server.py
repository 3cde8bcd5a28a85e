"""A real OAuth2 token endpoint on loopback (RFC 6749 §4.4 and §6), recording what it received.

Serves `POST /token` from a background thread. Client authentication by HTTP basic or form
fields; grants `client_credentials` and `refresh_token` (optionally rotating the refresh
token on each use). Tokens are `at-<n>-<random>`; `fail_next` makes the next calls fail.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl, unquote_plus

__all__ = ["JsonServer", "OAuthTokenServer", "RecordedTokenRequest"]


@dataclass(frozen=True, slots=True)
class RecordedTokenRequest:
    """One request as it arrived: method, path, lower-case headers, raw body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def form(self) -> dict[str, str]:
        return dict(parse_qsl(self.body.decode("ascii"), keep_blank_values=True))


class JsonServer:
    """An HTTP server on 127.0.0.1 whose `handle` returns (status, JSON object); records every request."""

    def __init__(self) -> None:
        self.requests: list[RecordedTokenRequest] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def handle(self, request: RecordedTokenRequest) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Self:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                recorded = RecordedTokenRequest(
                    "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                with owner._lock:
                    owner.requests.append(recorded)
                    status, payload = owner.handle(recorded)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name=type(self).__name__,
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class OAuthTokenServer(JsonServer):
    """`POST /token`: checks the client and the grant, answers a bearer token or an RFC 6749 error."""

    def __init__(
        self,
        *,
        client_id: str,
        client_secret: str | None,
        refresh_token: str | None = None,
        expires_in: int | None = 3600,
        rotate_refresh: bool = False,
    ) -> None:
        super().__init__()
        self.client_id = client_id
        self.client_secret = client_secret
        self.refresh_token = refresh_token
        self.expires_in = expires_in
        self.rotate_refresh = rotate_refresh
        self.issued: list[str] = []
        self.fail_next = 0

    @property
    def token_url(self) -> str:
        return self.url + "/token"

    def _client_ok(self, request: RecordedTokenRequest) -> bool:
        form = request.form
        auth = request.headers.get("authorization", "")
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            return unquote_plus(user) == self.client_id and unquote_plus(password) == self.client_secret
        if form.get("client_id") != self.client_id:
            return False
        return self.client_secret is None or form.get("client_secret") == self.client_secret

    def handle(self, request: RecordedTokenRequest) -> tuple[int, dict[str, Any]]:
        if self.fail_next:
            self.fail_next -= 1
            return 503, {"error": "temporarily_unavailable", "error_description": "try later"}
        if request.path != "/token":
            return 404, {"error": "not_found"}
        if not self._client_ok(request):
            return 401, {"error": "invalid_client"}
        form = request.form
        answer: dict[str, Any] = {}
        grant = form.get("grant_type")
        if grant == "refresh_token":
            if form.get("refresh_token") != self.refresh_token:
                return 400, {"error": "invalid_grant"}
            if self.rotate_refresh:
                self.refresh_token = f"rt-{len(self.issued)}-{secrets.token_hex(8)}"
                answer["refresh_token"] = self.refresh_token
        elif grant != "client_credentials":
            return 400, {"error": "unsupported_grant_type"}
        token = f"at-{len(self.issued)}-{secrets.token_hex(12)}"
        self.issued.append(token)
        answer.update({"access_token": token, "token_type": "Bearer"})
        if self.expires_in is not None:
            answer["expires_in"] = self.expires_in
        return 200, answer
