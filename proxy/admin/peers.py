"""The lead worker's calls to the other workers' private admin sockets (asyncio, concurrent).

Worker i > 0 serves its admin API, unauthenticated, on `<state_dir>/workers/w<i>.sock`
(proxy/state/unix_sockets.py) (mode 0600). The lead asks every peer at once and gets one
answer per peer: what it said, or why it did not (not running, no answer within the
timeout, an error answer). A peer that did not confirm is never counted as done.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from sandgate.proxy.state.unix_sockets import internal_socket_folder
from sandgate.proxy.worker_role import WorkerRole

__all__ = ["READ_TIMEOUT", "WRITE_TIMEOUT", "PeerAnswer", "Peers", "peer_socket"]

# Scrapes and status: a peer slower than this is shown as not answering.
READ_TIMEOUT = 1.0
# Changes: a peer's reload builds its policy (seconds for large rule sets or Rego).
WRITE_TIMEOUT = 10.0


def peer_socket(state_path: Path, role: WorkerRole) -> Path:
    """Where worker `role` serves its private admin socket."""
    return internal_socket_folder(state_path) / f"w{role.index}.sock"


@dataclass(frozen=True, slots=True)
class PeerAnswer:
    """One peer's answer: `ok` when it answered 2xx; otherwise `error` says why."""

    index: int
    ok: bool
    status: int | None = None
    body: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def view(self) -> dict[str, Any]:
        """What an admin answer shows of it."""
        out: dict[str, Any] = {"index": self.index, "ok": self.ok}
        if self.error is not None:
            out["error"] = self.error
        return out


class Peers:
    """The lead's view of workers 1..count-1."""

    def __init__(self, state_path: Path, role: WorkerRole) -> None:
        self.count = role.count
        self.sockets = {i: peer_socket(state_path, WorkerRole(i, role.count)) for i in range(1, role.count)}
        # One client per peer, made once: building one loads a CA bundle (tens of ms). No
        # pooled connections: a new one per call (cheap on a unix socket) never meets a
        # restarted peer's closed one.
        self._clients = {
            i: httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(
                    uds=str(sock), limits=httpx.Limits(max_keepalive_connections=0)
                ),
                base_url="http://sandgate",
            )
            for i, sock in self.sockets.items()
        }

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()

    async def call(
        self, method: str, path: str, *, within: float, json: dict[str, Any] | None = None
    ) -> list[PeerAnswer]:
        """Ask every peer at once; one answer each, in worker order."""
        return list(
            await asyncio.gather(
                *(self._one(i, sock, method, path, within, json) for i, sock in self.sockets.items())
            )
        )

    async def _one(
        self, index: int, sock: Path, method: str, path: str, within: float, json: dict[str, Any] | None
    ) -> PeerAnswer:
        client = self._clients[index]
        try:
            # The whole exchange within `within` (httpx's timeout applies per read, not in total).
            resp = await asyncio.wait_for(client.request(method, path, json=json, timeout=within), within)
        except (TimeoutError, httpx.TimeoutException):
            return PeerAnswer(index, False, error=f"worker {index} did not answer within {within:g} s")
        except (httpx.TransportError, OSError):
            return PeerAnswer(
                index, False, error=f"worker {index} is not running (nothing answers on {sock})"
            )
        try:
            body = resp.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        if not resp.is_success:
            message = str(body.get("error") or f"HTTP {resp.status_code}")
            return PeerAnswer(index, False, resp.status_code, body, f"worker {index}: {message}")
        return PeerAnswer(index, True, resp.status_code, body)
