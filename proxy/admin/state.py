"""What the admin API reads and acts on in the running gateway: one `AdminState`."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from sandgate.proxy.admin.peers import Peers
from sandgate.proxy.approvals import Approvals
from sandgate.proxy.approvals.fleet_inbox import FleetInbox
from sandgate.proxy.approvals.grants import GrantBook
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.metrics import SinkFigures
from sandgate.proxy.net.sandbox_listeners import SandboxListeners
from sandgate.proxy.refresh.reloader import PolicyReloader
from sandgate.proxy.stores.protocols import CredentialStore, SandboxStore
from sandgate.proxy.worker_role import SINGLE, WorkerRole

__all__ = ["AdminState", "PublishReload"]

# Fleet mode: tell every gateway to reload (the registry's publish_reload); gets the new version.
PublishReload = Callable[[str], Awaitable[int]]


@dataclass
class AdminState:
    """What the admin API reads and acts on in the running gateway."""

    gateway_id: str
    ctx: GatewayContext
    reloader: PolicyReloader
    listeners: Callable[[], list[str]]
    ready: Callable[[], bool]
    sandboxes: SandboxStore | None = None
    credentials: CredentialStore | None = None
    # Drops the broker's cached stored values after a change through the API.
    credentials_changed: Callable[[], None] | None = None
    redis: aioredis.Redis | None = None
    redis_timeout: float = 0.5
    # Wired by fleet mode; None: `POST /v1/policy/reload` reloads this gateway only.
    publish_reload: PublishReload | None = None
    # Fleet mode: re-read the shared registry and reload (after a sandbox change); False when redis failed.
    refresh: Callable[[str], Awaitable[bool]] | None = None
    # The transparent and DNS listeners jails need, opened on demand (`POST /v1/listeners/sandbox`).
    sandbox_listeners: SandboxListeners | None = None
    # The SIEM sinks' figures (sandgate.proxy.audit.sinks.figures), for /v1/status.
    audit_sinks: Callable[[], Iterable[SinkFigures]] = lambda: ()
    started: float = field(default_factory=time.time)
    # Which worker serves this API: the lead (public socket) or a peer (private socket).
    role: WorkerRole = SINGLE
    # The lead of several workers: the peers it fans changes and reads out to.
    peers: Peers | None = None
    # This worker's requests held for an operator's decision (`ask` rules).
    approvals: Approvals | None = None
    # The gateway's grants beyond the grants files (sandbox scope; tenant scope in a fleet).
    grants: GrantBook | None = None
    # Fleet mode, on the lead: the other gateways' held requests, and decisions handed to them.
    fleet_inbox: FleetInbox | None = None
