"""sandgate's addons in process: a real GatewayContext (policy from YAML files, audit to a
file) driven through mitmproxy's own test master (`taddons`) and test flows (`tflow`). The
addons are the gateway's pipeline (sandgate.proxy.addons.pipeline), or the part of it a test
names, always in the gateway's order."""

from __future__ import annotations

import base64
import json
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mitmproxy import connection, hooks, http
from mitmproxy.proxy import server_hooks
from mitmproxy.test import taddons, tflow

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.resolver import StaticResolver
from sandgate.proxy.addons.pipeline import Shared, pipeline
from sandgate.proxy.audit.trail import AuditLog, JsonlFileSink
from sandgate.proxy.context import GatewayContext

__all__ = ["InProcess", "connect_flow", "in_process", "proxy_flow", "server_connect"]


class InProcess:
    """A chain of addons on a real context; `hook` dispatches an event as mitmproxy's master does."""

    def __init__(self, ctx: GatewayContext, audit_path: Path, tctx: taddons.context) -> None:
        self.ctx = ctx
        self.audit_path = audit_path
        self.tctx = tctx

    async def hook(self, event: hooks.Hook) -> None:
        """Every addon's handler for `event`, in chain order (a raising one is logged, as live)."""
        await self.tctx.master.addons.trigger_event(event)

    async def connect(self, client: connection.Client) -> None:
        await self.hook(server_hooks.ClientConnectedHook(client))

    def records(self) -> list[dict[str, Any]]:
        """Every audit record written so far (flushes and closes the trail: call once, at the end)."""
        self.ctx.audit.close()
        return [json.loads(line) for line in self.audit_path.read_text().splitlines()]


@contextmanager
def in_process(
    tmp_path: Path,
    tenants: dict[str, str],
    hosts: dict[str, list[str]],
    only: Collection[type],
    *,
    shared: Shared | None = None,
    audit_wait: float = 0.05,
) -> Iterator[InProcess]:
    """The pipeline's addons of the classes in `only` (in pipeline order), built from `shared`,
    on policy files in tmp_path."""
    rules = tmp_path / "rules"
    (rules / "tenants").mkdir(parents=True)
    for filename, text in tenants.items():
        (rules / "tenants" / filename).write_text(text)
    audit_path = tmp_path / "audit.jsonl"
    audit = AuditLog([JsonlFileSink(audit_path, max_bytes=1 << 24, backups=1)], max_wait=audit_wait)
    audit.start()
    ctx = GatewayContext(load_policy_dir(rules), StaticResolver(hosts), AddressGuard(["127.0.0.0/8"]), audit)
    try:
        addons = pipeline(ctx, shared or Shared(), only=only)
        with taddons.context(*addons, loadcore=False) as tctx:
            yield InProcess(ctx, audit_path, tctx)
    finally:
        audit.close()


def _auth(sandbox: str, token: str) -> str:
    return "Basic " + base64.b64encode(f"{sandbox}:{token}".encode()).decode()


def proxy_flow(
    client: connection.Client,
    url: str,
    *,
    method: str = "GET",
    sandbox: str,
    token: str,
    content: bytes = b"",
    headers: dict[str, str] | None = None,
) -> http.HTTPFlow:
    """A proxy request (Host names the URL's authority) from `client`, with its credential."""
    request = http.Request.make(method, url, content)
    request.headers["Host"] = request.authority or f"{request.host}:{request.port}"
    request.headers["Proxy-Authorization"] = _auth(sandbox, token)
    for name, value in (headers or {}).items():
        request.headers[name] = value
    flow = tflow.tflow(client_conn=client)
    flow.request = request
    return flow


def connect_flow(
    client: connection.Client, host: str, port: int, *, sandbox: str, token: str
) -> http.HTTPFlow:
    """A CONNECT to host:port from `client`, with its credential."""
    request = http.Request(
        host,
        port,
        b"CONNECT",
        b"",
        f"{host}:{port}".encode(),
        b"",
        b"HTTP/1.1",
        http.Headers(((b"Proxy-Authorization", _auth(sandbox, token).encode()),)),
        b"",
        None,
        0,
        None,
    )
    flow = tflow.tflow(client_conn=client)
    flow.request = request
    return flow


def server_connect(
    client: connection.Client, address: tuple[str, int]
) -> server_hooks.ServerConnectionHookData:
    """The hook data of an upstream connection `client`'s handler is about to open."""
    server = connection.Server(address=address)
    return server_hooks.ServerConnectionHookData(server=server, client=client)
