"""Build and run the gateway: a mitmproxy master with only the addons sandgate needs.

`DumpMaster` would load ~35 addons and dispatch every event to each; sandgate's master has
the proxy server, layer selection and TLS, then sandgate's own addons in pipeline order.
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
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import structlog
from mitmproxy import master, options
from mitmproxy.addons import next_layer, proxyserver, tlsconfig

from sandgate.brokers import Broker
from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.errors import PolicySetError, SandgateError
from sandgate.policy.model.grants import Grants
from sandgate.policy.model.loader import load_policy_dir, policy_files
from sandgate.policy.model.policyset import PolicySet, TenantPolicy
from sandgate.policy.rego.compiler import use_store
from sandgate.policy.rego.engine import make_engine
from sandgate.policy.rego.protocol import PolicyEngine
from sandgate.policy.resolver import Resolver
from sandgate.proxy import banner
from sandgate.proxy.addons.audit_completion import AuditCompletion
from sandgate.proxy.addons.connection_limits import ConnectionLimits, SandboxConnectionCap
from sandgate.proxy.addons.connection_limits import check_seams as check_connection_seams
from sandgate.proxy.addons.credentials import CredentialBroker
from sandgate.proxy.addons.drain import DrainEnd, Drainer, DrainStart
from sandgate.proxy.addons.gate import Gate
from sandgate.proxy.addons.h2_guard import H2Guard
from sandgate.proxy.addons.h2_guard import check_seam as check_h2_seam
from sandgate.proxy.addons.head_caps import HeadGuard
from sandgate.proxy.addons.hop_by_hop import HopByHop
from sandgate.proxy.addons.http_seam import HttpErrorSeam, check_seam
from sandgate.proxy.addons.identify import Identify
from sandgate.proxy.addons.latency import UpstreamTiming
from sandgate.proxy.addons.limits import TenantLimits, count_tunnel_bytes
from sandgate.proxy.addons.trailers import Trailers
from sandgate.proxy.addons.transparent import Transparent
from sandgate.proxy.addons.upgrades import Upgrades
from sandgate.proxy.admin.access_requests import sweep_file_grants
from sandgate.proxy.admin.fanout import confirm_reload
from sandgate.proxy.admin.peers import Peers
from sandgate.proxy.admin.server import AdminServer
from sandgate.proxy.admin.state import AdminState
from sandgate.proxy.approvals import Approvals
from sandgate.proxy.approvals.auto import AutoApprover, through_admin_api
from sandgate.proxy.approvals.endpoint import AccessEndpoint
from sandgate.proxy.approvals.grants import GrantBook, GrantStore, RedisGrants, StateFileGrants
from sandgate.proxy.approvals.proposal_trail import ProposalTrail
from sandgate.proxy.approvals.reserved import ReservedName
from sandgate.proxy.approvals.webhook import webhook_for
from sandgate.proxy.audit.forward import ForwardSink
from sandgate.proxy.audit.intents import IntentJournal
from sandgate.proxy.audit.leftovers import read_cut_count, settle_dead_processes
from sandgate.proxy.audit.redis_stream import RedisStreamSink
from sandgate.proxy.audit.spool import Spool
from sandgate.proxy.audit.trail import AuditLog, AuditSink, StdoutSink, audit_file_sink
from sandgate.proxy.bindcheck import check_endpoints, endpoints, failure_line, quiet_mitmproxy_bind_errors
from sandgate.proxy.broker_setup import configure_broker
from sandgate.proxy.ca import ensure_ca
from sandgate.proxy.config import DnsListenerConfig, GatewayConfig, RedisConfig
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.errors import ListenerError
from sandgate.proxy.fd_budget import raise_fd_limit
from sandgate.proxy.fleet.channel import publish_reload_with
from sandgate.proxy.fleet.limits_sync import LimitSync
from sandgate.proxy.fleet.local_broker import worker_limit_sync
from sandgate.proxy.fleet.redis_client import Keys, connect, connect_sync
from sandgate.proxy.fleet.registry_sync import FleetRegistrySync, default_gateway_id
from sandgate.proxy.front.handoff import self_test as handoff_self_test
from sandgate.proxy.front.passthrough import PassthroughFront
from sandgate.proxy.metrics import METRICS, GatewayGauges
from sandgate.proxy.mitm.backpressure import install as install_backpressure
from sandgate.proxy.mitm.close_fix import install as install_close_fix
from sandgate.proxy.mitm.closer import ConnectionCloser
from sandgate.proxy.mitm.head_caps import install as install_head_caps
from sandgate.proxy.mitm.head_caps import self_test as head_caps_self_test
from sandgate.proxy.mitm.reuse_port import install as install_reuse_port
from sandgate.proxy.mitm.reuse_port import set_front
from sandgate.proxy.mitm.speedups import install as install_speedups
from sandgate.proxy.mitm.trailers import patch_http1_trailers
from sandgate.proxy.mitm.tunnel_meter import install as install_tunnel_meter
from sandgate.proxy.mitm.websocket_guard import install as install_websocket_guard
from sandgate.proxy.mitm.websocket_guard import self_test as websocket_guard_self_test
from sandgate.proxy.net.dns_listener import DnsListener
from sandgate.proxy.net.host_addresses import OwnAddressWatcher, own_addresses
from sandgate.proxy.net.name_bindings import NameBindings
from sandgate.proxy.net.sandbox_listeners import SandboxListeners
from sandgate.proxy.registration import gateway_ports, interface_exists, prepare_host_table, sync_static_rules
from sandgate.proxy.reloader import PolicyReloader, RulesKeptError, problem_view, report_problems
from sandgate.proxy.resolver_setup import build_resolver
from sandgate.proxy.secret_refresh import SecretRefresher
from sandgate.proxy.statusfile import STATUS_FILE, read_status, remove_status, write_status
from sandgate.proxy.stores.credentials_factory import stored_secrets
from sandgate.proxy.stores.credentials_watch import CredentialWatcher
from sandgate.proxy.stores.placeholder_key import load_placeholder_key
from sandgate.proxy.stores.protocols import SandboxStore
from sandgate.proxy.stores.registry import (
    load_registry,
    merge_registry,
    merge_registry_lenient,
    registry_digest,
)
from sandgate.proxy.stores.registry_file import FileSandboxStore
from sandgate.proxy.stores.registry_redis import RedisSandboxStore, rules_checker
from sandgate.proxy.tasks import spawn
from sandgate.proxy.upstream_trust import upstream_trust_file
from sandgate.proxy.version import version_of
from sandgate.proxy.worker_role import SUPERVISOR_GONE

__all__ = ["Gateway", "build_resolver", "fleet_gateway_id", "serve"]

log = structlog.get_logger("sandgate.runtime")


def build_engine(config: GatewayConfig) -> PolicyEngine:
    """The Rego engine the config names, behind the decision cache."""
    rego = config.rego
    token = None
    if rego.opa.token:
        token = load_placeholder_key(rego.opa.token, create=False, min_bytes=1).reveal()
    return make_engine(
        rego.engine,
        url=rego.opa.url if rego.engine == "opa" else None,
        timeout=rego.opa.timeout_seconds,
        token=token,
        cache_size=rego.cache.size,
        cache_ttl=rego.cache.ttl_seconds,
        max_loaded_bundles=rego.max_loaded_bundles,
    )


def fleet_gateway_id(config: GatewayConfig, rcfg: RedisConfig) -> str:
    """This process's name in the fleet: the gateway's, and `-w<i>` for worker i of several."""
    return (rcfg.gateway_id or default_gateway_id(config.state_path)) + config.worker_suffix


def build_file_sink(config: GatewayConfig) -> AuditSink:
    """The audit file; a worker of several forwards to the supervisor's collector, its one
    writer (spooling in its own folder once the supervisor is gone)."""
    role = config.worker
    if role.count > 1:
        return ForwardSink(config.audit_socket_path, f"w{role.index}", spool=Spool(config.worker_dir))
    return audit_file_sink(config)


def settle_at_start(config: GatewayConfig, sink: AuditSink) -> int:
    """A gateway of one process writes what its earlier processes left (spools, intents cut by
    their exit) before its own records; how many records were cut by an exit."""
    try:
        return settle_dead_processes(config.state_path, config.audit_path, sink.write).cut
    except OSError as e:
        log.error("audit.settle_failed", error=e.strerror)  # left for the next start
        return 0


def build_stream_sink(config: GatewayConfig, rcfg: RedisConfig) -> RedisStreamSink:
    """The fleet audit stream, spooling under the state dir while redis is away."""
    return RedisStreamSink(
        connect_sync(rcfg),
        Keys(rcfg.prefix),
        config.stream_spool_path,
        maxlen=rcfg.audit_stream_maxlen,
        dedupe_ttl=config.audit.stream_dedupe_ttl_seconds,
        gateway=config.audit.gateway_name or socket.gethostname(),
    )


class _Lifecycle:
    """Checks the listeners came up, starts reload watching, closes services on exit."""

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
        await gw.reloader.start()
        if gw.front is not None:
            gw.front.start()
        gw.credential_watch.start()
        gw.secret_refresh.start()
        if gw.webhook is not None:
            gw.webhook.start()
        if gw.proposal_trail is not None:
            gw.proposal_trail.start()
        if gw.own_watch is not None:
            await gw.own_watch.start()
        if gw.limit_sync is not None:
            await gw.limit_sync.start()
        if gw.config.rego.engine == "opa" and not await gw.engine.health():
            # Decisions still fail closed (policy_error) until the server answers.
            log.error("rego.opa_unhealthy", url=gw.config.rego.opa.url)
        if gw.dns is not None:
            try:
                await gw.dns.start()
            except OSError as e:
                dns = next(p for p in endpoints(gw.config) if p.what == "DNS listener")
                gw.fail_start(failure_line(dns, e))
                return
        gw.listen_addrs = [(str(a[0]), int(a[1])) for s in ps.servers for a in s.listen_addrs]
        if not await gw.start_host_rules():
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
        # What could still reload or audit (admin requests, fleet events) stops first; a step
        # that fails is logged and the rest still run; the audit log closes last, always.
        steps: list[Callable[[], Awaitable[None]]] = [gw.stop_admin, gw.reloader.stop]
        if gw.fleet is not None:
            steps.append(gw.fleet.stop)
        steps += [gw.credential_watch.stop, gw.secret_refresh.stop, gw.credential_store.aclose]
        if gw.webhook is not None:
            steps.append(gw.webhook.stop)
        if gw.proposal_trail is not None:
            steps.append(gw.proposal_trail.stop)
        if gw.own_watch is not None:
            steps.append(gw.own_watch.stop)
        if gw.limit_sync is not None:
            steps.append(gw.limit_sync.stop)
        steps += [gw.broker.aclose, gw.engine.close]
        if gw.front is not None:
            steps.append(gw.front.stop)
        if gw.dns is not None:
            steps.append(gw.dns.stop)
        for step in steps:
            try:
                await step()
            except Exception:
                log.exception("gateway.stop_step_failed", step=getattr(step, "__qualname__", "?"))
        await asyncio.to_thread(gw.ctx.audit.close)


class Gateway:
    """One gateway process: policy, services, and a mitmproxy master with sandgate's addons.

    Build it inside a running event loop (mitmproxy's master needs one). `resolver` replaces
    the configured one (tests pass a real implementation of the Resolver protocol).
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        resolver: Resolver | None = None,
    ) -> None:
        self.config = config
        # `stored:` credentials: read through an in-memory cache that change events invalidate.
        self.credential_store, stored, secrets = stored_secrets(config)
        self.credential_watch = CredentialWatcher(
            self.credential_store, stored, interval=config.reload.interval_seconds
        )
        self.broker = Broker(
            placeholder_key=load_placeholder_key(config.placeholder_key_ref), secrets=secrets
        )
        # The scrubbers know every injectable secret before the first request, and as it changes.
        self.secret_refresh = SecretRefresher(self.broker, interval=config.reload.interval_seconds)
        stored.on_change = self._stored_credentials_changed
        # Set after the first load (which has no redis snapshot yet: run() syncs before serving).
        self.fleet: FleetRegistrySync | None = None
        # The admin API's backends: the registry (file, or redis in a fleet), the credential store.
        self.admin: AdminServer | None = None
        self._idle_peers: Peers | None = None  # the lead's, when it serves no admin API itself
        # (version of the policy built from them, the rules): when the files stop loading, the
        # sandbox registry is merged onto these instead.
        self._rules_in_force: tuple[str, PolicySet] | None = None
        # (transparent port, DNS port) of each worker once the listeners are bound: from then on
        # every load installs the host rules of the tenant files' interface sandboxes.
        self.host_ports: list[tuple[int, int]] | None = None
        if config.rego.bundle_store:
            use_store(config.path(config.rego.bundle_store))
        self.engine = build_engine(config)
        policy = self._load_policy()
        report_problems(policy)
        ensure_ca(config.ca_dir)
        guard_cfg = config.address_guard
        own = own_addresses() if guard_cfg.own_addresses == "auto" else guard_cfg.own_addresses
        sinks: list[AuditSink] = [build_file_sink(config)]
        # Records written for requests a process's exit cut (the supervisor counts them with workers).
        self.cut_at_start = settle_at_start(config, sinks[0]) if config.worker.count == 1 else 0
        if config.audit.stdout:
            sinks.append(StdoutSink())
        if config.redis is not None:
            sinks.append(build_stream_sink(config, config.redis))
        audit = AuditLog(
            sinks,
            queue_size=config.audit.queue_size,
            max_wait=config.audit.max_wait_seconds,
            acknowledge=config.audit.fsync == "per_batch",
            # Which of several workers decided: one trail, and the record still says where.
            stamp={"worker": config.worker.index} if config.worker.count > 1 else None,
            # What goes upstream is on disk before it goes, until its record is written.
            journal=IntentJournal(config.worker_dir),
        )
        # A worker's hand-off to the collector, told when the supervisor is gone.
        self.forward = next((s for s in sinks if isinstance(s, ForwardSink)), None)
        tcfg = config.transparent
        self.ctx = GatewayContext(
            policy=policy,
            resolver=resolver or build_resolver(config.resolver),
            guard=AddressGuard(guard_cfg.reachable_by_name, own, guard_cfg.tenant_reachable),
            audit=audit,
            bindings=NameBindings(min_ttl=tcfg.binding_min_ttl, max_ttl=tcfg.binding_max_ttl),
            reroute=tcfg.reroute,
            broker=self.broker,
            engine=self.engine,
        )
        # The gateway's own addresses follow interface changes (sandboxes' veths come and go).
        self.own_watch: OwnAddressWatcher | None = None
        if guard_cfg.own_addresses == "auto":
            self.own_watch = OwnAddressWatcher(
                self._own_addresses_changed, frozenset(own), interval=guard_cfg.refresh_seconds
            )
        self.limit_sync: LimitSync | None = None
        if config.redis is not None:
            self.limit_sync = LimitSync(
                self.ctx.limiter,
                connect(config.redis),
                Keys(config.redis.prefix),
                config.limits.sync_interval_seconds,
                gateway_id=fleet_gateway_id(config, config.redis),
            )
            self.ctx.limit_learn = self.limit_sync.learn
        else:
            # Workers of one gateway without redis: the local broker their supervisor started.
            self.limit_sync = worker_limit_sync(
                self.ctx.limiter, config.limits.sync_interval_seconds, config.worker
            )
            if self.limit_sync is not None:
                self.ctx.limit_learn = self.limit_sync.learn
        self.dns: DnsListener | None = None
        if config.dns is not None:
            self.dns = DnsListener(
                self.ctx, self.ctx.bindings, config.dns.host, config.dns.port, max_ttl=config.dns.max_ttl
            )
        self.reloader = PolicyReloader(
            self.ctx,
            lambda: self._load_policy(self.ctx.policy),
            self._watched_files,
            watch=config.reload.watch,
            interval=config.reload.interval_seconds,
            settle=config.reload.settle_seconds,
            on_reload=lambda _: self._write_status(),
            audit=config.worker.lead,
        )
        if config.redis is not None:
            self.fleet = FleetRegistrySync(
                config.redis,
                fleet_gateway_id(config, config.redis),
                self.reloader.reload,
                lambda: self.ctx.policy.version,
                poll_interval=config.redis.sync_interval_seconds,
                last_reload=lambda: self.reloader.report(),
                epoch_file=config.fleet_epoch_path,
            )
        # The admin API's registry: the file on one machine; in a fleet, redis through the sync's client.
        self.sandbox_store: SandboxStore = (
            RedisSandboxStore(self.fleet.client, self.fleet.keys, check=rules_checker(config.rules_path))
            if self.fleet is not None
            else FileSandboxStore(config)
        )
        self.ready = asyncio.Event()
        self.exit_code = 0
        # One line saying which listener could not be bound (serve() raises it as ListenerError).
        self.start_failure: str | None = None
        quiet_mitmproxy_bind_errors()
        self.listen_addrs: list[tuple[str, int]] = []
        # Caps on HTTP/1 heads live inside mitmproxy's HTTP/1 layer (sandgate.proxy.mitm.head_caps).
        install_head_caps()
        install_close_fix()
        # mitmproxy's HTTP internals the error seam builds on: refuse to serve if they moved.
        check_seam()
        # Bytes that pile up behind a pending hook pause the reader (one value per process).
        install_backpressure(config.connections.max_held_bytes)
        # mitmproxy's per-event costs (hook dispatch, field checks, option reads), cut in place.
        install_speedups()
        # Bytes a guest sends into a tunnel mitmproxy passes through count against its limits.
        ctx = self.ctx
        install_tunnel_meter(
            lambda client, nbytes: count_tunnel_bytes(ctx, ctx.connections.get(client.id), nbytes)
        )
        self.master = master.Master(options.Options(confdir=str(config.ca_dir)))
        self.drainer = Drainer(self.ctx, self.master)
        self._drain_task: asyncio.Future[None] | None = None
        self._orphaned = False
        patch_http1_trailers()
        # WebSocket sessions: a cap on one message, control frames checked, clean closes.
        install_websocket_guard()
        server = proxyserver.Proxyserver()
        closer = ConnectionCloser(server)
        # Requests held for an operator's decision (`ask` rules): this worker's pending store.
        self.approvals = Approvals(
            timeout=config.approvals.ask_timeout_seconds, max_held=config.approvals.max_held_per_sandbox
        )
        # A drain answers held requests at once (503, "cut by shutdown"): no operator is coming.
        self.drainer.on_drain.append(self.approvals.cut_held)
        # Each worker announces the requests it holds (ConfigError here when the secret is unreadable).
        self.webhook = webhook_for(
            config.approvals.webhook,
            self.approvals,
            gateway_id=self.fleet.gateway_id if self.fleet is not None else socket.gethostname(),
            worker=config.worker.index,
        )
        # Requests the operator's ceiling proves harmless are approved without a person, by
        # every worker alike: held ones in its own store, proposals through the gateway's admin
        # API (the lead's socket: a peer's own private socket approves nothing).
        if config.approvals.auto == "within_ceiling":
            ctx = self.ctx
            approver = AutoApprover(
                config.ceiling_path,
                lambda: ctx.policy,
                self.approvals,
                through_admin_api(config.gateway_admin_socket_path),
            )
            self.approvals.on_opened.append(approver.opened)
        # The guests' own endpoint at the reserved name (sandgate.proxy.approvals.reserved).
        endpoint = None
        self.proposal_trail: ProposalTrail | None = None
        if config.approvals.endpoint_name is not None:
            self.ctx.reserved = ReservedName(
                config.approvals.endpoint_name, config.approvals.endpoint_address
            )
            # With several workers a poll may land on one that does not hold the request: it
            # asks the lead's admin socket, which asks every worker.
            lead_admin = None
            if config.admin.enabled and config.worker.count > 1:
                lead_admin = config.gateway_admin_socket_path
            self.proposal_trail = ProposalTrail(self.ctx, self.approvals)
            endpoint = AccessEndpoint(
                self.ctx,
                self.approvals,
                self.ctx.reserved,
                per_minute=config.approvals.proposals_per_minute,
                lead_admin=lead_admin,
                trail=self.proposal_trail,
            )
        # Grants approvals added for one sandbox (and, in a fleet, for a tenant): hot, in force
        # on every worker (and gateway) without a reload; the lead sweeps the expired ones.
        grant_store: GrantStore = (
            RedisGrants(self.fleet.client, config.redis.prefix)
            if self.fleet is not None and config.redis is not None
            else StateFileGrants(config.state_path / "grants.json")
        )
        self.grant_book = GrantBook(
            grant_store,
            self._put_grants,
            self.ctx.audit.emit,
            sweep=config.worker.lead,
            default_ttl=config.approvals.grant_ttl_seconds,
            max_ttl=config.approvals.grant_max_ttl_seconds,
        )
        # The caps are the gateway's: each of its workers enforces its share of them.
        self.connection_limits = ConnectionLimits(
            self.ctx, config.connections, server, workers=config.worker.count
        )
        self.h2_guard = H2Guard(self.ctx, config.http2)
        # The passthrough front reads the explicit listeners' connections first (sandgate.proxy.front).
        self.front: PassthroughFront | None = None
        if config.passthrough.front:
            handoff_self_test()
            self.front = PassthroughFront(
                self.ctx,
                self.connection_limits,
                self.drainer,
                heads=config.heads,
                connections=config.connections,
                require_sni=config.passthrough.require_sni,
            )
            self.drainer.held = self.front
            install_reuse_port(reuse_port=False)
            set_front(server, self.front.handler_for)
        # Pipeline order: connection caps first (a refused connection reaches nothing else), then
        # identity and transparent steering before mitmproxy's layer selection (so a raw-TCP
        # approval picks the layer), the HTTP/2 guard on the chosen layer, decisions after it, then
        # the tenant limits on what was allowed and the completion of its audit record.
        self.master.addons.add(
            server,
            self.connection_limits,
            Identify(self.ctx),
            SandboxConnectionCap(self.ctx, self.connection_limits),
            Transparent(self.ctx),
            next_layer.NextLayer(),
            # Before the HTTP/2 guard: it pre-sets its server on the (guarded) HttpLayer.
            HttpErrorSeam(self.ctx),
            self.h2_guard,
            tlsconfig.TlsConfig(),
            DrainStart(self.drainer),
            HeadGuard(self.ctx, config.heads),
            # Before the Gate: h2c offers are stripped before a request is decided, and a
            # refused answer is in place when the Gate records the exchange.
            Upgrades(self.ctx, closer, config.websocket),
            Trailers(closer),
            Gate(
                self.ctx,
                require_sni=config.passthrough.require_sni,
                closer=closer,
                approvals=self.approvals,
                endpoint=endpoint,
            ),
            # Right after the Gate: limits count only what it allowed, before the broker wraps a
            # metered body; the record of an allowed exchange is completed before the broker
            # scrubs the response whose size it counts.
            TenantLimits(self.ctx, closer),
            AuditCompletion(self.ctx),
            HopByHop(),
            CredentialBroker(self.ctx),
            UpstreamTiming(),
            DrainEnd(self.drainer),  # after every addon that records
            _Lifecycle(self),
        )
        self.master.options.update(
            mode=[listener.spec for listener in config.listeners],
            # Decide before connecting: with "eager", mitmproxy dials upstream before our hooks run.
            connection_strategy="lazy",
            upstream_cert=False,
            ssl_verify_upstream_trusted_ca=upstream_trust_file(config),
            stream_large_bodies="1m",
            # Silence on tunnels the gateway cannot see into (and on a request waiting upstream).
            tcp_timeout=max(1, round(config.connections.tunnel_idle_timeout_seconds)),
        )
        # Transparent and DNS listeners for jails, opened through the admin API when missing.
        self.sandbox_listeners = SandboxListeners(
            self.master,
            self.ctx,
            self.dns,
            dns_max_ttl=(config.dns or DnsListenerConfig()).max_ttl,
            backlog=config.connections.listen_backlog,
            changed=self._sandbox_listeners_opened,
        )
        # mitmproxy internals the idle sweep and the HTTP/2 guard rely on: fail start-up if moved.
        check_connection_seams()
        check_h2_seam(self.master.options)
        # The same for the caps on HTTP/1 heads (sandgate.proxy.mitm.head_caps).
        head_caps_self_test(self.master.options)
        websocket_guard_self_test(self.master.options)

    def _load_policy(self, previous: PolicySet | None = None) -> PolicySet:
        """The rules directory plus the dynamic sandbox registry (runs in a worker thread).

        Isolated unless `strict_policy`: a broken tenant file keeps its last good version (the
        policy in force is passed as `previous`), and a registry entry whose tenant did not
        load is left out, so one tenant cannot stop the others' changes.
        """
        strict = self.config.strict_policy
        try:
            rules = load_policy_dir(self.config.rules_path, previous=previous, isolate=not strict)
            refused: PolicySetError | None = None
        except PolicySetError as e:
            kept = self._rules_in_force
            if previous is None or kept is None or kept[0] != previous.version:
                raise
            rules, refused = kept[1], e
        registry = load_registry(self.config.registry_path)
        if strict:
            merged = merge_registry(rules, registry, self.config.registry_path)
        else:
            merged, rejected = merge_registry_lenient(rules, registry, str(self.config.registry_path))
            if rejected:
                log.error("registry.entries_refused", source="file", errors=[str(e) for e in rejected])
        if self.fleet is not None:
            merged, rejected = merge_registry_lenient(
                merged, self.fleet.sandboxes(), "redis sandbox registry"
            )
            if rejected:
                log.error("registry.entries_refused", source="redis", errors=[str(e) for e in rejected])
        if self.host_ports is not None:
            # The tenant files' interface sandboxes get their host rules before their identity.
            self.sync_host_rules(merged)
        configure_broker(self.broker, merged)
        self._rules_in_force = (merged.version, rules)
        if refused is not None:
            # The files did not load; the registry still changes on the rules in force.
            raise RulesKeptError(merged, refused)
        return merged

    async def start_host_rules(self) -> bool:
        """At start: the host rules of the tenant files' interface sandboxes, installed again
        (a reboot empties nftables); False (do not serve) when they cannot be."""
        transparent = [lst.port for lst in self.config.listeners if lst.mode == "transparent"]
        if transparent and self.dns is not None:
            # Every worker writes the same table: all workers' ports, each interface steered to one.
            self.host_ports = gateway_ports(self.config, transparent[0], self.dns.port)
        try:
            await asyncio.to_thread(self.sync_host_rules, self.ctx.policy, force=True)
        except (SandgateError, RuntimeError, OSError) as e:
            log.error("host_rules.failed", error=str(e))
            return False
        return True

    def sync_host_rules(self, policy: PolicySet, *, force: bool = False) -> None:
        """Install the host rules of the tenant files' interface sandboxes (blocking: nft)."""
        extra = []
        if self.fleet is not None:
            extra = [s for s in self.fleet.sandboxes() if s.interface and interface_exists(s.interface)]
        sync_static_rules(self.config, policy, self.host_ports, extra, force=force)

    def _stored_credentials_changed(self) -> None:
        self.broker.secrets_changed()
        self.secret_refresh.poke()

    def _watched_files(self, policy: PolicySet) -> list[Path]:
        return [
            *policy_files(self.config.rules_path),
            *map(Path, policy.token_files),
            *map(Path, policy.rego_files),
            self.config.registry_path,
        ]

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

    def _own_addresses_changed(self, addresses: frozenset[str]) -> None:
        """Swap in a guard with the new own-address set (one assignment: no request sees half)."""
        self.ctx.guard = self.ctx.guard.with_own_addresses(addresses)

    async def stop_admin(self) -> None:
        admin, self.admin = self.admin, None
        if admin is not None:
            await admin.stop()
        peers, self._idle_peers = self._idle_peers, None
        if peers is not None:
            with contextlib.suppress(Exception):
                await peers.aclose()

    def _put_grants(self, grants: Grants) -> None:
        self.ctx.grants = grants

    def admin_state(self) -> AdminState:
        """What the admin API serves from this gateway."""
        state = AdminState(
            gateway_id=socket.gethostname(),
            ctx=self.ctx,
            reloader=self.reloader,
            listeners=lambda: [f"{h}:{p}" for h, p in self.listen_addrs],
            ready=self.ready.is_set,
            sandboxes=self.sandbox_store,
            credentials=self.credential_store,
            credentials_changed=self.credential_watch.source.invalidate,
            sandbox_listeners=self.sandbox_listeners,
            role=self.config.worker,
            approvals=self.approvals,
            grants=self.grant_book,
        )
        if state.role.lead:
            # The lead takes expired grants out of the tenants' grants files (and records it).
            self.grant_book.sweep_files = partial(
                sweep_file_grants, state, partial(self.reloader.reload, "grant_expired", with_peers=True)
            )
        if state.role.lead and state.role.count > 1:
            # The lead answers for the gateway: it fans changes and reads out to the other workers.
            state.peers = Peers(self.config.state_path, state.role)
            self.reloader.confirm_peers = partial(confirm_reload, state)
        fleet = self.fleet
        if fleet is not None:
            state.gateway_id = fleet.gateway_id

            async def publish(_version: str) -> int:
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
        state = self.admin_state()
        # A peer of several workers always serves its private socket: the lead's reloads and
        # changes reach it there, even when the operator turned the admin API off.
        if self.config.admin.enabled or not self.config.worker.lead:
            # Raises ConfigError (socket taken by a live gateway, bad token reference) before serving.
            self.admin = AdminServer(self.config, state)
            await self.admin.start()
        else:
            self._idle_peers = state.peers
        if any(lst.mode == "transparent" for lst in self.config.listeners):
            await _prepare_host_table(self.config)
        self.ctx.audit.start()
        await self.reloader.record_start()
        if self.fleet is not None:
            # Before the listeners open: a registered sandbox is known from the first request.
            await self.fleet.start()
        # Before the listeners open too: a grant in force before a restart is from the first request.
        await self.grant_book.start()
        loop = asyncio.get_running_loop()
        if signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.terminate)
            loop.add_signal_handler(
                signal.SIGHUP,
                lambda: spawn(self.reloader.reload("sighup", with_peers=True), name="sandgate-sighup-reload"),
            )
            if self.forward is not None:
                loop.add_signal_handler(SUPERVISOR_GONE, self.supervisor_gone)
        try:
            await self.master.run()
        finally:
            # mitmproxy leaves its listening sockets to process exit; close them, so a gateway
            # run in process (tests, embedding) gives its ports back.
            # (Only those that run: stopping one that never bound logs an empty error line.)
            proxyserver = self.master.addons.get("proxyserver")
            if proxyserver is not None:
                for server in list(proxyserver.servers):
                    if server.is_running:
                        with contextlib.suppress(Exception):
                            await server.stop()
            if signals:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, SUPERVISOR_GONE):
                    loop.remove_signal_handler(sig)
            await self.stop_admin()  # already done by the done hook, unless the master failed first
            METRICS.detach()
            await self.grant_book.stop()
            if self.fleet is not None:
                await self.fleet.stop()
            self.ctx.audit.close()
            self._report_spool()
        sys.stderr.flush()
        return self.exit_code

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
    if config.worker.count > 1:
        # The supervisor checked every address before it started the workers (and the
        # explicit port is shared with the other workers now: a probe would find it taken).
        install_reuse_port()
    else:
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
