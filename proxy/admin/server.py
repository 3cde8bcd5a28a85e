"""The admin API server: a unix socket (mode 0600) always, TCP with a bearer token when asked.

With several workers, the lead (worker 0) serves the gateway's socket and TCP listener; each
other worker serves only a private socket beside its folder (`<state_dir>/workers/w<i>.sock`:
proxy/admin/peers.py), for the lead's fan-out (proxy/admin/fanout.py) and for looking at one worker.

With `console.enabled`, the TCP listener also serves the operator's console under /console/
(sandgate.proxy.console), which acts through this API's own functions (`AdminActions`).

It runs on the gateway's event loop (tornado over asyncio) and is never one of the
guest-facing listeners. Start-up refuses a socket path another live gateway answers on and
replaces a stale one; the socket is removed on exit when it is still this process's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path

import structlog
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from sandgate.brokers import Secret
from sandgate.proxy.admin.handlers import AdminActions, make_app
from sandgate.proxy.admin.peers import peer_socket
from sandgate.proxy.admin.state import AdminState
from sandgate.proxy.config import GatewayConfig, split_listen
from sandgate.proxy.console.app import Console, build_console
from sandgate.proxy.errors import ConfigError, ListenerError
from sandgate.proxy.redis.client import connect
from sandgate.proxy.startup.bindcheck import Endpoint, failure_line
from sandgate.proxy.state.unix_sockets import answers
from sandgate.proxy.stores.placeholder_key import load_placeholder_key

__all__ = ["AdminServer"]

log = structlog.get_logger("sandgate.admin")

MAX_BODY_BYTES = 1024 * 1024
MIN_TOKEN_BYTES = 16


def bind_admin_socket(path: Path) -> socket.socket:
    """A listening unix socket at `path`, mode 0600; a stale socket file is replaced."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.exists() or path.is_symlink():
        if not path.is_socket():
            raise ListenerError(
                f"admin socket {path}: exists and is not a socket; remove it or set admin.socket"
            )
        if answers(path):
            raise ListenerError(
                f"admin socket {path}: another gateway answers on it (same state_dir?): "
                "stop it, or give this one its own state_dir"
            )
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Created 0600 from the start: no moment where another user could connect.
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError as e:
        sock.close()
        raise ListenerError(
            f"admin socket {path}: {e.strerror or e}; set admin.socket to a shorter path"
        ) from None
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.setblocking(False)
    sock.listen(128)
    return sock


def load_admin_token(reference: str | None) -> Secret | None:
    """The bearer token from its reference (env:VAR or file:PATH), at least 16 bytes."""
    if reference is None:
        return None
    try:
        return load_placeholder_key(reference, create=False, min_bytes=MIN_TOKEN_BYTES)
    except ConfigError as e:
        raise ConfigError(f"admin.token: {str(e).replace('placeholder key', 'token')}") from None


class AdminServer:
    """Serves the admin API for one gateway; `start` binds, `stop` closes and cleans up."""

    def __init__(self, config: GatewayConfig, state: AdminState) -> None:
        self.config = config
        self.state = state
        role = state.role
        self.private = not role.lead
        self.socket_path = peer_socket(config.state_path, role) if self.private else config.admin_socket_path
        self.addresses: list[str] = []
        self._servers: list[HTTPServer] = []
        self._inode: int | None = None
        self.console: Console | None = None

    async def start(self) -> None:
        """Bind the socket (and TCP): ListenerError for an address, ConfigError for the token."""
        admin = self.config.admin
        token = load_admin_token(admin.token)
        if self.config.redis is not None and self.state.redis is None:
            self.state.redis = connect(self.config.redis)
            self.state.redis_timeout = self.config.redis.timeout_seconds
        sock = await asyncio.to_thread(bind_admin_socket, self.socket_path)
        self._inode = os.stat(self.socket_path).st_ino
        app = make_app(self.state, token, require_token=False, private=self.private)
        unix = HTTPServer(app, max_body_size=MAX_BODY_BYTES)
        unix.add_socket(sock)
        self._servers.append(unix)
        self.addresses.append(f"unix:{self.socket_path}")
        if admin.listen is not None and not self.private:
            assert token is not None  # the config refuses listen without a token
            host, port = split_listen(admin.listen)
            try:
                socks = bind_sockets(port, host)
            except OSError as e:
                await self.stop()
                endpoint = Endpoint("admin listener", host, port, "tcp", "change admin.listen in the config")
                raise ListenerError(failure_line(endpoint, e)) from None
            if self.config.console.enabled:
                # The console: on the TCP listener only, with its own login (the same token).
                self.console = build_console(self.config, token, AdminActions(self.state))
            console_routes = self.console.routes if self.console is not None else ()
            app = make_app(self.state, token, require_token=True, extra=console_routes)
            tcp = HTTPServer(app, max_body_size=MAX_BODY_BYTES)
            tcp.add_sockets(socks)
            self._servers.append(tcp)
            self.addresses.append(admin.listen)
        log.info("admin.listening", addresses=self.addresses, console=self.console is not None)

    async def stop(self) -> None:
        if self.console is not None:
            self.console.close()
        for server in self._servers:
            server.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.close_all_connections(), 5)
        self._servers.clear()
        if self.state.peers is not None:
            with contextlib.suppress(Exception):
                await self.state.peers.aclose()
        if self.state.redis is not None:
            with contextlib.suppress(Exception):
                await self.state.redis.aclose()
        try:
            if self._inode is not None and os.stat(self.socket_path).st_ino == self._inode:
                self.socket_path.unlink()
        except OSError:
            pass
