"""The gateway's whole addon pipeline in process: every addon `pipeline(...)` builds, in its
order, on a real GatewayContext (policy from YAML files, audit to a file), driven through
mitmproxy's test master (`taddons`) with its hook classes and test flows (`tflow`).

No addon is named here: what the pipeline holds (however its addons are split or renamed)
is what runs. Only the parts the pipeline is given are built here (`Shared`: the proxy
server, the connection caps, the HTTP/2 guard, the drainer, the closer), as the gateway
builds them. Tests read outcomes only: responses, audit records, refused upstream dials.
"""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mitmproxy import connection, hooks, options, tls
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.proxy import server_hooks
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.tls import TlsClienthelloHook, parse_client_hello
from mitmproxy.test import taddons

from sandgate.brokers import Broker
from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.rego.protocol import PolicyEngine
from sandgate.policy.resolver import Resolver, StaticResolver
from sandgate.proxy.addons.connection_limits import ConnectionLimits
from sandgate.proxy.addons.drain import Drainer
from sandgate.proxy.addons.h2_guard import H2Guard
from sandgate.proxy.addons.pipeline import Shared, pipeline
from sandgate.proxy.audit.trail import AuditLog, JsonlFileSink
from sandgate.proxy.config import ConnectionsConfig, Http2Config
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.mitm.closer import ConnectionCloser

__all__ = ["Pipeline", "client_hello", "whole_pipeline"]


class Pipeline:
    """The running pipeline: dispatch hooks to it, read what it recorded."""

    def __init__(
        self, ctx: GatewayContext, audit_path: Path, tctx: taddons.context, drainer: Drainer
    ) -> None:
        self.ctx = ctx
        self.audit_path = audit_path
        self.tctx = tctx
        # The gateway's drain (SIGTERM): `await drainer.drain(seconds)`.
        self.drainer = drainer

    async def hook(self, event: hooks.Hook) -> None:
        """Every addon's handler for `event`, in pipeline order, as mitmproxy's master runs them."""
        await self.tctx.master.addons.trigger_event(event)

    async def connect(self, client: connection.Client) -> None:
        await self.hook(server_hooks.ClientConnectedHook(client))

    async def dial(self, client: connection.Client, address: tuple[str, int]) -> str | None:
        """What the pipeline says when `client`'s handler is about to open an upstream
        connection to `address`: None (it opens), or the error that refuses it."""
        server = connection.Server(address=address)
        await self.hook(server_hooks.ServerConnectHook(server_hooks.ServerConnectionHookData(server, client)))
        return server.error

    async def hello(self, client: connection.Client, sni: str | None) -> tls.ClientHelloData:
        """`client` sends a TLS ClientHello naming `sni`; the hook's data as the addons left it
        (`ignore_connection`: passed through or refused, not intercepted)."""
        data = tls.ClientHelloData(Context(client, self.tctx.options), client_hello(sni))
        await self.hook(TlsClienthelloHook(data))
        return data

    def records(self) -> list[dict[str, Any]]:
        """Every audit record written so far (flushes and closes the trail: call once, at the end)."""
        self.ctx.audit.close()
        return [json.loads(line) for line in self.audit_path.read_text().splitlines()]


@contextmanager
def whole_pipeline(
    tmp_path: Path,
    tenants: dict[str, str],
    hosts: dict[str, list[str]],
    *,
    resolver: Resolver | None = None,
    engine: PolicyEngine | None = None,
    broker: Broker | None = None,
    files: dict[str, str] | None = None,
) -> Iterator[Pipeline]:
    """Every addon of the pipeline on policy files in tmp_path: `tenants` (file name: text) in
    rules/tenants/, and `files` (path under rules/: text) such as secrets and Rego modules.
    Names resolve through `hosts` unless `resolver` is given; `broker` is configured with the
    policy's credentials."""
    rules = tmp_path / "rules"
    (rules / "tenants").mkdir(parents=True)
    written = {f"tenants/{name}": text for name, text in tenants.items()} | (files or {})
    for name, text in written.items():
        path = rules / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o600)  # secret files must be the owner's alone
    policy: PolicySet = load_policy_dir(rules)
    if broker is not None:
        from sandgate.proxy.startup.broker_setup import configure_broker

        configure_broker(broker, policy)
    audit_path = tmp_path / "audit.jsonl"
    audit = AuditLog([JsonlFileSink(audit_path, max_bytes=1 << 24, backups=1)], max_wait=0.05)
    audit.start()
    ctx = GatewayContext(
        policy,
        resolver or StaticResolver(hosts),
        AddressGuard(["127.0.0.0/8"]),
        audit,
        broker=broker,
        engine=engine,
    )
    try:
        confdir = tmp_path / "mitmproxy"
        with taddons.context(options=options.Options(confdir=str(confdir)), loadcore=False) as tctx:
            server = Proxyserver()
            drainer = Drainer(ctx, tctx.master)
            shared = Shared(
                server=server,
                connection_limits=ConnectionLimits(ctx, ConnectionsConfig(), server),
                h2_guard=H2Guard(ctx, Http2Config()),
                drainer=drainer,
                closer=ConnectionCloser(server),
            )
            tctx.master.addons.add(*pipeline(ctx, shared))
            # As the master does at start: every addon configured from the options in force.
            tctx.master.addons.trigger(hooks.ConfigureHook(set(tctx.options.keys())))
            yield Pipeline(ctx, audit_path, tctx, drainer)
    finally:
        audit.close()


def client_hello(sni: str | None) -> tls.ClientHello:
    """A real ClientHello (Python's TLS client's) naming `sni`, as mitmproxy parses it."""
    context = ssl.create_default_context()
    context.check_hostname = False
    outgoing = ssl.MemoryBIO()
    conn = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=sni)
    # The ClientHello is written; the handshake then waits for the server's answer.
    with contextlib.suppress(ssl.SSLWantReadError):
        conn.do_handshake()
    parsed = parse_client_hello(outgoing.read())
    if parsed is None:
        raise AssertionError("no ClientHello was written")
    return parsed
