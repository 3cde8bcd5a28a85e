"""Build and run the gateway: a mitmproxy master with only the addons sandgate needs.

`DumpMaster` would load ~35 addons and dispatch every event to each; sandgate's master has
the proxy server, layer selection and TLS, then sandgate's own addons in pipeline order
(`sandgate.proxy.addons.pipeline`). `Gateway.__init__` is the composition root: mitmproxy's
patches, one builder per subsystem (`sandgate.proxy.assembly`), the pipeline, the services.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
import sys
import time
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import structlog
from mitmproxy import master, options
from mitmproxy.addons import proxyserver

from sandgate.policy.model.grants import Grants
from sandgate.policy.model.policyset import TenantPolicy
from sandgate.policy.resolver import Resolver
from sandgate.proxy.addons.connection_limits import ConnectionLimits
from sandgate.proxy.addons.drain import Drainer
from sandgate.proxy.addons.h2_guard import H2Guard
from sandgate.proxy.addons.pipeline import Shared, pipeline
from sandgate.proxy.admin.fanout import confirm_reload
from sandgate.proxy.admin.fleet_requests import fleet_inbox_for
from sandgate.proxy.admin.peers import Peers
from sandgate.proxy.admin.server import AdminServer
from sandgate.proxy.admin.state import AdminState
from sandgate.proxy.approvals.fleet_inbox import FleetInbox
from sandgate.proxy.approvals.operator_decisions import sweep_file_grants
from sandgate.proxy.assembly.approvals import build_approvals
from sandgate.proxy.assembly.audit import build_audit
from sandgate.proxy.assembly.broker import build_broker
from sandgate.proxy.assembly.fleet import build_fleet, build_limit_sync
from sandgate.proxy.assembly.front import build_front
from sandgate.proxy.assembly.gateway_context import build_context
from sandgate.proxy.assembly.mitmproxy_patches import install_mitmproxy_patches
from sandgate.proxy.assembly.policy_load import PolicyLoader
from sandgate.proxy.assembly.rego import build_engine
from sandgate.proxy.assembly.services import Calls, Service, Services, Stage
from sandgate.proxy.assembly.stores import build_stores
from sandgate.proxy.audit.leftovers import read_cut_count
from sandgate.proxy.audit.sinks.figures import gateway_sink_figures
from sandgate.proxy.config import DnsListenerConfig, GatewayConfig
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.dns.listener import DnsListener
from sandgate.proxy.errors import ListenerError
from sandgate.proxy.fleet.channel import publish_reload_with
from sandgate.proxy.lean.choose import LeanPath, http1_path
from sandgate.proxy.metrics import METRICS, GatewayGauges
from sandgate.proxy.mitm.closer import ConnectionCloser
from sandgate.proxy.net.sandbox_listeners import SandboxListeners
from sandgate.proxy.redis.outage import REDIS_OUTAGE
from sandgate.proxy.refresh.reloader import PolicyReloader, problem_view, report_problems
from sandgate.proxy.sandboxes.registration import prepare_host_table
from sandgate.proxy.startup import banner
from sandgate.proxy.startup.bindcheck import check_endpoints, endpoints, failure_line
from sandgate.proxy.startup.ca import ensure_ca
from sandgate.proxy.startup.fd_budget import raise_fd_limit
from sandgate.proxy.startup.upstream_trust import upstream_trust_file
from sandgate.proxy.state.statusfile import STATUS_FILE, read_status, remove_status, write_status
from sandgate.proxy.stores.credentials import RekeyableStore
from sandgate.proxy.stores.registry import load_registry, registry_digest
from sandgate.proxy.tasks import spawn
from sandgate.proxy.version import version_of
from sandgate.proxy.worker_role import SUPERVISOR_GONE

__all__ = ["Gateway", "serve"]

log = structlog.get_logger("sandgate.runtime")

BEFORE_LISTENERS, SERVING = Stage.BEFORE_LISTENERS, Stage.SERVING


class _Lifecycle:
    """The gateway's own hooks, last in the pipeline: once mitmproxy's listeners are up, check
    them and start the services that serve; at exit, stop the admin API, then every service."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def running(self) -> None:
        gw = self.gateway
        if gw.stopping():
            # A SIGTERM while the listeners came up: its drain closes them; nothing failed.
            return
        ps = gw.master.addons.get("proxyserver")
        down = [s for s in ps.servers if not s.is_running]
        if down or len(ps.servers) == 0:
            gw.fail_start(listener_failure(gw.config, down))
            return
        if gw.config.rego.engine == "opa" and not await gw.engine.health():
            # Decisions still fail closed (policy_error) until the server answers.
            log.error("rego.opa_unhealthy", url=gw.config.rego.opa.url)
        try:
            await gw.services.start(SERVING)
        except ListenerError as e:  # the DNS listener's port
            gw.fail_start(str(e))
            return
        gw.listen_addrs = [(str(a[0]), int(a[1])) for s in ps.servers for a in s.listen_addrs]
        dns_port = gw.dns.port if gw.dns is not None else None
        if not await gw.policy_loader.start_host_rules(gw.ctx.policy, dns_port):
            gw.exit_code = 1
            gw.shutdown()
            return
        if gw.stopping():
            return
        ready = gw.ready_info(ps.servers)
        log.info("gateway.ready", **banner.event_fields(ready))
        # Before the status file: with workers, the supervisor reads the lead's rows once it sees it.
        banner.announce(ready, gw.config, sys.stderr)
        gw._write_status()
        gw.ready.set()

    async def done(self) -> None:
        gw = self.gateway
        remove_status(gw.config.status_path)
        # What could still reload or audit stops first: the admin API, then the services
        # bottom-up (the fleet's events and the reload watch before what a reload uses; the
        # audit trail last, always). A step that fails is logged and the rest still run.
        try:
            await gw.stop_admin()
        except Exception:
            log.exception("gateway.stop_step_failed", step="admin API")
        await gw.services.stop()


class _DnsListenerService:
    """The DNS listener as a service: the configured one starts once the listeners serve (a
    port it cannot bind is a ListenerError); whichever the gateway has at exit stops, one
    opened on demand too."""

    name = "dns listener"
    stage = SERVING

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def start(self) -> None:
        dns = self.gateway.dns
        if dns is None:
            return
        try:
            await dns.start()
        except OSError as e:
            endpoint = next(p for p in endpoints(self.gateway.config) if p.what == "DNS listener")
            raise ListenerError(failure_line(endpoint, e)) from None

    async def stop(self) -> None:
        if self.gateway.dns is not None:
            await self.gateway.dns.stop()


class Gateway:
    """One gateway process: policy, services, and a mitmproxy master with sandgate's addons.

    Build it inside a running event loop (mitmproxy's master needs one). `resolver` replaces
    the configured one (tests pass a real implementation of the Resolver protocol).
    """

    def __init__(self, config: GatewayConfig, *, resolver: Resolver | None = None) -> None:
        self.config = config
        self.credentials = build_broker(config)
        self.engine = build_engine(config)
        # The first load: the broker learns its credentials; no fleet snapshot yet (run() syncs).
        self.policy_loader = PolicyLoader(config, self.credentials.broker)
        policy = self.policy_loader.load()
        report_problems(policy)
        ensure_ca(config.ca_dir)
        audit = build_audit(config)
        self.forward, self.cut_at_start = audit.forward, audit.cut_at_start
        self.siem_sinks = audit.siem
        context = build_context(config, policy, audit.log, self.credentials.broker, self.engine, resolver)
        self.ctx, self.own_watch = context.ctx, context.own_watch
        self_checks = install_mitmproxy_patches(config, self.ctx)
        self.master = master.Master(options.Options(confdir=str(config.ca_dir)))
        self.drainer = Drainer(self.ctx, self.master)
        self.dns = _dns_listener(config, self.ctx)
        self.reloader = self._reloader()
        self.fleet = self.policy_loader.fleet = build_fleet(config, self.ctx, self.reloader)
        self.limit_sync = build_limit_sync(config, self.ctx, self.fleet)
        self.stores = build_stores(config, self.fleet)
        gateway_id = self.fleet.gateway_id if self.fleet is not None else socket.gethostname()
        self.approvals = build_approvals(config, self.ctx, self.drainer, self.stores.grants, gateway_id)
        server = proxyserver.Proxyserver()
        # The caps are the gateway's: each of its workers enforces its share of them.
        self.connection_limits = ConnectionLimits(
            self.ctx, config.connections, server, workers=config.worker.count
        )
        self.h2_guard = H2Guard(self.ctx, config.http2)
        self.front = build_front(config, self.ctx, server, self.connection_limits, self.drainer)
        self.master.addons.add(*pipeline(self.ctx, self._shared(server)))
        self.master.options.update(**_mitmproxy_options(config))
        # Transparent and DNS listeners for jails, opened through the admin API when missing.
        self.sandbox_listeners = SandboxListeners(
            self.master,
            self.ctx,
            self.dns,
            dns_max_ttl=(config.dns or DnsListenerConfig()).max_ttl,
            backlog=config.connections.listen_backlog,
            changed=self._sandbox_listeners_opened,
        )
        for check in self_checks:  # mitmproxy's internals where the patches expect them, or no start
            check(self.master.options)
        self.services = self._services()
        self.admin: AdminServer | None = None
        self._idle_peers: Peers | None = None  # the lead's, when it serves no admin API itself
        self._fleet_inbox: FleetInbox | None = None  # the lead's, in a fleet
        self.ready = asyncio.Event()
        self.exit_code = 0
        # One line saying which listener could not be bound (serve() raises it as ListenerError).
        self.start_failure: str | None = None
        self.listen_addrs: list[tuple[str, int]] = []
        self._drain_task: asyncio.Future[None] | None = None
        self._orphaned = False

    @property
    def credential_store(self) -> RekeyableStore:
        """The admin API's credential store (file, or redis in a fleet)."""
        return self.credentials.store

    def _reloader(self) -> PolicyReloader:
        cfg = self.config.reload
        return PolicyReloader(
            self.ctx,
            lambda: self.policy_loader.load(self.ctx.policy),
            self.policy_loader.watched_files,
            watch=cfg.watch,
            interval=cfg.interval_seconds,
            settle=cfg.settle_seconds,
            on_reload=lambda _: self._write_status(),
            audit=self.config.worker.lead,
        )

    def _shared(self, server: proxyserver.Proxyserver) -> Shared:
        """What the pipeline's addons share."""
        config = self.config
        return Shared(
            server=server,
            connection_limits=self.connection_limits,
            h2_guard=self.h2_guard,
            drainer=self.drainer,
            closer=ConnectionCloser(server),
            heads=config.heads,
            websocket=config.websocket,
            agent_protocols=config.agent_protocols,
            require_sni=config.passthrough.require_sni,
            approvals=self.approvals.pending,
            endpoint=self.approvals.endpoint,
            lifecycle=_Lifecycle(self),
            lean=LeanPath() if http1_path(config) == "lean" else None,
        )

    def _services(self) -> Services:
        """Every service, each below what it uses: started top-down (those before the
        listeners by run(), the rest once they serve), stopped bottom-up after the admin API."""
        creds, approvals = self.credentials, self.approvals
        listed: list[Service | None] = [
            # First: every service below may write records; it closes last.
            Calls("audit trail", BEFORE_LISTENERS, self.ctx.audit.start, self._close_audit),
            Calls("rego engine", BEFORE_LISTENERS, on_stop=self.engine.close),
            Calls("credential store", BEFORE_LISTENERS, on_stop=creds.store.aclose),
            Calls("broker", BEFORE_LISTENERS, on_stop=creds.broker.aclose),
            # The start policy's problems, audited before any reload's record.
            Calls("start record", BEFORE_LISTENERS, on_start=self.reloader.record_start),
            _DnsListenerService(self),
            Calls.of("passthrough front", SERVING, self.front),
            Calls.of("own address watch", SERVING, self.own_watch),
            Calls.of("proposal trail", SERVING, approvals.proposal_trail),
            Calls.of("webhook", SERVING, approvals.webhook),
            Calls.of("secret refresh", SERVING, creds.refresh),
            Calls.of("credential watch", SERVING, creds.watch),
            # Before the listeners: a registered sandbox is known from the first request.
            Calls.of("fleet registry", BEFORE_LISTENERS, self.fleet),
            Calls.of("limit sync", SERVING, self.limit_sync),  # through the fleet's client, when in a fleet
            # Before the listeners: a grant in force before a restart is from the first request.
            Calls.of("grants", BEFORE_LISTENERS, approvals.grants),
            # Last: a reload uses everything above.
            Calls("reload watch", SERVING, self.reloader.start, self.reloader.stop),
        ]
        return Services(service for service in listed if service is not None)

    async def _close_audit(self) -> None:
        await asyncio.to_thread(self.ctx.audit.close)

    def _sandbox_listeners_opened(self) -> None:
        """A listener opened on demand: it is served, stopped at exit and shown like the rest."""
        self.dns = self.sandbox_listeners.dns
        ps = self.master.addons.get("proxyserver")
        self.listen_addrs = [(str(a[0]), int(a[1])) for s in ps.servers for a in s.listen_addrs]
        self._write_status()

    def _write_status(self) -> None:
        cfg = self.config
        status: dict[str, Any] = {
            "policy_version": self.ctx.policy.version,
            "registry_digest": registry_digest(load_registry(cfg.registry_path)),
            "listeners": [f"{h}:{p}" for h, p in self.listen_addrs],
            "transparent_port": self.sandbox_listeners.transparent_port(),
            "dns_port": self.dns.port if self.dns else None,
            "opened_on_demand": self.sandbox_listeners.opened,
            "ca_cert": str(cfg.ca_dir / "mitmproxy-ca-cert.pem"),
            "policy_problems": [problem_view(p) for p in self.ctx.policy.problems],
        }
        write_status(cfg.status_path, status)
        if cfg.worker.count > 1 and cfg.worker.lead:
            _mirror_gateway_status(cfg.state_path / STATUS_FILE, status)

    def ready_info(self, servers: Iterable[Any]) -> banner.Ready:
        """What the start-up banner says (mitmproxy's running servers give the bound ports)."""
        listeners = [
            banner.Listener(s.mode.type_name, str(a[0]), int(a[1])) for s in servers for a in s.listen_addrs
        ]
        if self.dns is not None:
            listeners.append(banner.Listener("dns", self.dns.host, self.dns.port))
        policy = self.ctx.policy
        return banner.Ready(
            version=version_of("sandgate"),
            pid=os.getpid(),
            policy_version=policy.version,
            listeners=listeners,
            tenants=list(policy.tenants),
            sandboxes=list(policy.sandboxes.values()),
            ca_cert=self.config.ca_dir / "mitmproxy-ca-cert.pem",
            audit=self.config.audit_path,
            admin=list(self.admin.addresses) if self.admin is not None else [],
        )

    async def stop_admin(self) -> None:
        inbox, self._fleet_inbox = self._fleet_inbox, None
        if inbox is not None:
            await inbox.stop()
            with contextlib.suppress(Exception):
                await inbox.client.aclose()
        admin, self.admin = self.admin, None
        if admin is not None:
            await admin.stop()
        peers, self._idle_peers = self._idle_peers, None
        if peers is not None:
            with contextlib.suppress(Exception):
                await peers.aclose()

    def admin_state(self) -> AdminState:
        """What the admin API serves from this gateway."""
        state = AdminState(
            gateway_id=socket.gethostname(),
            ctx=self.ctx,
            reloader=self.reloader,
            listeners=lambda: [f"{h}:{p}" for h, p in self.listen_addrs],
            ready=self.ready.is_set,
            sandboxes=self.stores.sandboxes,
            credentials=self.credentials.store,
            credentials_changed=self.credentials.watch.source.invalidate,
            sandbox_listeners=self.sandbox_listeners,
            role=self.config.worker,
            approvals=self.approvals.pending,
            grants=self.approvals.grants,
            audit_sinks=lambda: gateway_sink_figures(self.config, self.siem_sinks),
        )
        if state.role.lead:
            # The lead takes expired grants out of the tenants' grants files (and records it).
            self.approvals.grants.sweep_files = partial(
                sweep_file_grants, state.ctx, partial(self.reloader.reload, "grant_expired", with_peers=True)
            )
        if state.role.lead and state.role.count > 1:
            # The lead answers for the gateway: it fans changes and reads out to the other workers.
            state.peers = Peers(self.config.state_path, state.role)
            self.reloader.confirm_peers = partial(confirm_reload, state)
        fleet = self.fleet
        if fleet is not None:
            state.gateway_id = fleet.gateway_id

            async def publish(_version: str) -> int:
                with REDIS_OUTAGE.track("fleet.publish"):
                    return await publish_reload_with(fleet.client, fleet.keys)

            state.publish_reload = publish
            # A registry change is read back from redis, so it is in force here before the answer.
            state.refresh = fleet.sync
        return state

    def _attach_metrics(self) -> None:
        METRICS.attach(
            GatewayGauges(
                connections=lambda: len(self.ctx.connections),
                front_spliced=lambda: self.front.spliced if self.front is not None else 0,
                front_handed_off=lambda: self.front.handed_off if self.front is not None else 0,
                audit_depth=lambda: self.ctx.audit.depth,
                policy_version=lambda: self.ctx.policy.version,
                reload_failures=lambda: self.reloader.failures,
                spooled=lambda: self.ctx.audit.stream.spool_depth if self.ctx.audit.stream else 0,
                audit_unrecorded=lambda: self.ctx.audit.unrecorded,
                audit_cut_by_exit=self._cut_by_exit,
                connections_refused=lambda: self.connection_limits.refused,
                connections_evicted=lambda: self.connection_limits.evicted,
                connections_idle_closed=lambda: self.connection_limits.idle_closed,
                http2_abusive=lambda: self.h2_guard.abusive,
                open_fds=lambda: self.connection_limits.budget.estimate,
                redis_replaced=lambda: self.fleet.replaced if self.fleet is not None else 0,
                policy_problems=lambda: [
                    (p.file, p.tenant or "", p.kept_last_good) for p in self.ctx.policy.problems
                ],
                # The tenants' grants files, and the grants the gateway keeps itself (scope
                # `sandbox`; a fleet's in redis).
                grants_in_force=lambda: _live_grants(self.ctx.policy.tenants.values(), self.ctx.grants),
                audit_sinks=lambda: gateway_sink_figures(self.config, self.siem_sinks),
            )
        )

    def stopping(self) -> bool:
        """SIGTERM/SIGINT was received: the gateway drains, and a listener it closed is no fault."""
        return self._drain_task is not None

    def fail_start(self, line: str) -> None:
        """A listener could not be bound: stop, exit 1, and say why in one line."""
        if self.stopping():
            return
        self.start_failure = line
        self.exit_code = 1
        self.shutdown()

    def shutdown(self) -> None:
        """Stop serving now; run() returns once connections and the audit queue are closed."""
        self.master.shutdown()

    def terminate(self) -> None:
        """SIGTERM/SIGINT: drain in-flight work (up to shutdown.drain_seconds), then stop;
        a second signal ends the drain at once (what was decided is still recorded)."""
        if self._drain_task is None:
            self._drain_task = spawn(self._drain_and_stop(), name="sandgate-drain")
        else:
            self.drainer.cut_now()

    def supervisor_gone(self) -> None:
        """The supervisor died (SUPERVISOR_GONE, sent again as each of its threads ends): drain
        as on SIGTERM, once; records the collector cannot take now go to this worker's spool."""
        if self.forward is None or self._orphaned:
            return
        self._orphaned = True
        log.warning("worker.supervisor_gone", spool=str(self.config.worker_dir))
        self.forward.orphaned()
        if self._drain_task is None:
            self.terminate()

    async def _drain_and_stop(self) -> None:
        try:
            await self.drainer.drain(self.config.shutdown.drain_seconds)
        except Exception:
            log.exception("gateway.drain_failed")
        finally:
            self.shutdown()

    async def run(self, *, signals: bool = True) -> int:
        """Serve until shutdown (SIGTERM/SIGINT when `signals`); SIGHUP reloads the policy."""
        self._attach_metrics()
        soft, hard = raise_fd_limit()
        log.info("gateway.fd_limit", soft=soft, hard=hard)
        # First: a second gateway on this state dir stops here (its socket is taken), before
        # anything of this one starts.
        await self._start_admin()
        if any(lst.mode == "transparent" for lst in self.config.listeners):
            await _prepare_host_table(self.config)
        await self.services.start(BEFORE_LISTENERS)
        loop = asyncio.get_running_loop()
        if signals:
            self._handle_signals(loop)
        try:
            await self.master.run()
        finally:
            await self._close_listeners()
            if signals:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, SUPERVISOR_GONE):
                    loop.remove_signal_handler(sig)
            await self.stop_admin()  # already done by the done hook, unless the master failed first
            METRICS.detach()
            await self.services.stop()  # the same: what the done hook did not stop
            self._report_spool()
        sys.stderr.flush()
        return self.exit_code

    async def _start_admin(self) -> None:
        """The admin API; ConfigError (socket taken by a live gateway, bad token reference) or
        ListenerError before anything serves."""
        state = self.admin_state()
        # A peer of several workers always serves its private socket: the lead's reloads and
        # changes reach it there, even when the operator turned the admin API off.
        if self.config.admin.enabled or not self.config.worker.lead:
            self.admin = AdminServer(self.config, state)
            await self.admin.start()
        else:
            self._idle_peers = state.peers
        if self.config.redis is not None and self.config.worker.lead and self.fleet is not None:
            # The lead publishes the gateway's held requests to the fleet and takes decisions on them.
            state.fleet_inbox = self._fleet_inbox = fleet_inbox_for(state, self.config.redis)
            await self._fleet_inbox.start()

    def _handle_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.terminate)
        loop.add_signal_handler(
            signal.SIGHUP,
            lambda: spawn(self.reloader.reload("sighup", with_peers=True), name="sandgate-sighup-reload"),
        )
        if self.forward is not None:
            loop.add_signal_handler(SUPERVISOR_GONE, self.supervisor_gone)

    async def _close_listeners(self) -> None:
        """mitmproxy leaves its listening sockets to process exit; close them, so a gateway run
        in process (tests, embedding) gives its ports back. (Only those that run: stopping one
        that never bound logs an empty error line.)"""
        server = self.master.addons.get("proxyserver")
        if server is None:
            return
        for instance in list(server.servers):
            if instance.is_running:
                with contextlib.suppress(Exception):
                    await instance.stop()

    def _cut_by_exit(self) -> int:
        """Records written for cut intents: this process's at start, or the supervisor's (the
        lead reports it; the lead's /metrics adds up its workers')."""
        if self.config.worker.count == 1:
            return self.cut_at_start
        return read_cut_count(self.config.state_path) if self.config.worker.lead else 0

    def _report_spool(self) -> None:
        """After the supervisor died: one line saying what was spooled and what was lost."""
        if self.forward is None or not self._orphaned:
            return
        log.warning(
            "audit.spooled",
            records=self.forward.spooled,
            lost=self.ctx.audit.unrecorded,
            spool=str(self.config.worker_dir),
            merged_by="the next start of this gateway",
        )


def _dns_listener(config: GatewayConfig, ctx: GatewayContext) -> DnsListener | None:
    """The configured DNS listener, not bound yet (None: none configured)."""
    if config.dns is None:
        return None
    return DnsListener(ctx, ctx.bindings, config.dns.host, config.dns.port, max_ttl=config.dns.max_ttl)


def _mitmproxy_options(config: GatewayConfig) -> dict[str, Any]:
    """mitmproxy's own options, set once sandgate's addons declared theirs."""
    return {
        "mode": [listener.spec for listener in config.listeners],
        # Decide before connecting: with "eager", mitmproxy dials upstream before our hooks run.
        "connection_strategy": "lazy",
        "upstream_cert": False,
        "ssl_verify_upstream_trusted_ca": upstream_trust_file(config),
        "stream_large_bodies": "1m",
        # Silence on tunnels the gateway cannot see into (and on a request waiting upstream).
        "tcp_timeout": max(1, round(config.connections.tunnel_idle_timeout_seconds)),
    }


def _live_grants(tenants: Iterable[TenantPolicy], kept: Grants) -> int:
    """Grants in force now: the tenants' grants files' and the gateway's own."""
    now = time.time()
    in_files = sum(1 for tenant in tenants for grant in tenant.grants if grant.live(now))
    return in_files + sum(1 for grant in kept if grant.live(now))


def listener_failure(config: GatewayConfig, down: list[Any]) -> str:
    """The line for mitmproxy servers that did not start (its ServerInstance objects)."""
    if not down:
        return "no listener started"
    server = down[0]
    specs = {e.spec: e for e in endpoints(config) if e.spec is not None}
    endpoint = specs.get(server.mode.full_spec)
    error = server.last_exception
    if endpoint is None or not isinstance(error, OSError):
        return f"listener {server.mode.full_spec} did not start: {type(error).__name__}"
    return failure_line(endpoint, error)


async def serve(config: GatewayConfig) -> int:
    """Run the gateway until SIGTERM/SIGINT; returns the process exit code.

    Raises ListenerError (one line) when an address to listen on cannot be bound: checked
    before anything starts, and again when the bind itself fails.
    """
    # With workers, the supervisor checked every address before it started them (and the
    # explicit port is shared with the other workers now: a probe would find it taken).
    if config.worker.count == 1:
        check_endpoints(config)
    gateway = Gateway(config)
    # Start-up objects (mitmproxy, the policy, compiled rules) live as long as the process: out
    # of the collector's sight, a full collection with thousands of connections open costs
    # milliseconds instead of a few hundred (a pause every tenant would wait through).
    gc.freeze()
    code = await gateway.run()
    if gateway.start_failure is not None:
        raise ListenerError(gateway.start_failure)
    return code


def _mirror_gateway_status(path: Path, status: dict[str, Any]) -> None:
    """The lead worker's change, in the gateway's status file as soon as it is made (a jail
    reads the listeners it opened right after the admin answer); the supervisor writes the
    same, a poll later. Before the supervisor wrote it (not every worker serves yet): nothing."""
    current = read_status(path)
    if current is None or "workers" not in current:
        return
    kept: dict[str, Any] = {k: current[k] for k in ("pid", "workers", "worker_pids") if k in current}
    write_status(path, {**status, **kept})


async def _prepare_host_table(config: GatewayConfig) -> None:
    """Refuse to start on another running gateway's nftables table (ConfigError); move this
    state_dir's rules out of an older sandgate's shared table. Without nft (no host rules
    on this host) there is nothing to check."""
    try:
        await asyncio.to_thread(prepare_host_table, config)
    except (OSError, RuntimeError) as e:
        log.warning("host_rules.unchecked", table=config.nft_table, error=str(e))
