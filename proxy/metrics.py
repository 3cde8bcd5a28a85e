"""Prometheus metrics of one gateway process, on their own registry (served by the admin API).

Hot-path calls (`decision`, `decision_seconds`, `upstream_seconds`, `injected`) cost one dict
lookup and one increment: label children are cached per label tuple. Everything that is a
level rather than an event (connections, audit queue, policy version, reload failures) is
read from the gateway when /metrics is scraped, so it costs nothing per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["METRICS", "GatewayGauges", "Metrics", "SinkFigures"]

# Deciding is sub-millisecond on the allowlist path, milliseconds with Rego or DNS.
DECISION_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.0)
UPSTREAM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A held request waits for a person: from a fraction of a second (automatic) to its timeout.
APPROVAL_WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)
NO_TENANT = "-"


class SinkFigures(NamedTuple):
    """One SIEM sink's counts and levels (sandgate.proxy.audit.sinks)."""

    name: str
    kind: str  # syslog, otlp, hec, elasticsearch
    spooled: int  # records queued
    delivered: int  # events acknowledged
    retried: int  # events sent again
    dropped_full: int  # records not queued: the queue was full
    rejected: int  # events the receiver refused for good
    queue_bytes: int
    oldest_seconds: float  # age of the oldest undelivered event (0: none)


@dataclass(frozen=True, slots=True)
class GatewayGauges:
    """Where scrape-time values come from: callables into the running gateway."""

    connections: Callable[[], int]
    audit_depth: Callable[[], int]
    policy_version: Callable[[], str]
    reload_failures: Callable[[], int]
    # The audit engineer's spooling sink provides this; 0 until then.
    spooled: Callable[[], int] = lambda: 0
    # Decisions denied without an audit record (no place in the audit queue).
    audit_unrecorded: Callable[[], int] = lambda: 0
    # Records written for requests a process's death cut (sandgate.proxy.audit.intents).
    audit_cut_by_exit: Callable[[], int] = lambda: 0
    # Connection limits (proxy/addons/connection_limits.py, proxy/addons/h2_guard.py).
    connections_refused: Callable[[], int] = lambda: 0
    connections_evicted: Callable[[], int] = lambda: 0
    connections_idle_closed: Callable[[], int] = lambda: 0
    http2_abusive: Callable[[], int] = lambda: 0
    open_fds: Callable[[], int] = lambda: 0
    # Fleet mode: times the fleet epoch in redis was found gone or changed (redis replaced).
    redis_replaced: Callable[[], int] = lambda: 0
    # The passthrough front (proxy/front/): tunnels it spliced, connections it gave to mitmproxy.
    front_spliced: Callable[[], int] = lambda: 0
    front_handed_off: Callable[[], int] = lambda: 0
    # Tenant files that did not load, as (file, tenant or "", kept its last good version).
    policy_problems: Callable[[], Iterable[tuple[str, str, bool]]] = lambda: ()
    # Grants in force (scopes `sandbox` and `tenant` of an approval): the grants store's count,
    # wired in proxy/runtime.py's _attach_metrics once it exposes one; 0 until then.
    grants_in_force: Callable[[], int] = lambda: 0
    # SIEM sinks (one process: its own; with workers the lead reports the collector's).
    audit_sinks: Callable[[], Iterable[SinkFigures]] = lambda: ()


class _GatewayCollector(Collector):
    def __init__(self, gauges: GatewayGauges) -> None:
        self.gauges = gauges

    def collect(self) -> Iterable[Metric]:
        g = self.gauges
        yield GaugeMetricFamily("sandgate_active_connections", "Open client connections", g.connections())
        yield GaugeMetricFamily(
            "sandgate_audit_queue_depth", "Audit records queued in memory", g.audit_depth()
        )
        yield GaugeMetricFamily(
            "sandgate_audit_spooled_records", "Audit records buffered on disk for a failed sink", g.spooled()
        )
        yield CounterMetricFamily(
            "sandgate_audit_unrecorded_denials",
            "Requests and connections denied without an audit record (no place in the audit queue)",
            g.audit_unrecorded(),
        )
        info = GaugeMetricFamily(
            "sandgate_policy_version_info", "The policy version in force", labels=["version"]
        )
        info.add_metric([g.policy_version()], 1)
        yield info
        yield CounterMetricFamily(
            "sandgate_audit_cut_by_exit",
            "Records written for requests (and tunnels) a process's death cut before their own "
            "record was written: the supervisor's count since it started (the lead reports it)",
            g.audit_cut_by_exit(),
        )
        yield CounterMetricFamily(
            "sandgate_policy_reload_failures",
            "Policy reloads that failed (the old policy stayed)",
            g.reload_failures(),
        )
        yield CounterMetricFamily(
            "sandgate_connections_refused",
            "Connections closed at connect by a connection limit (per source, per sandbox, fd headroom)",
            g.connections_refused(),
        )
        yield CounterMetricFamily(
            "sandgate_connections_evicted",
            "Idle unidentified connections closed to make room for a new one (per-source cap, fd headroom)",
            g.connections_evicted(),
        )
        yield CounterMetricFamily(
            "sandgate_connections_idle_closed",
            "Connections closed by the idle timeout",
            g.connections_idle_closed(),
        )
        yield CounterMetricFamily(
            "sandgate_http2_abusive_connections",
            "HTTP/2 connections ended with GOAWAY for resetting or overrunning streams",
            g.http2_abusive(),
        )
        yield GaugeMetricFamily(
            "sandgate_open_fds", "File descriptors open (estimate between samples)", g.open_fds()
        )
        yield CounterMetricFamily(
            "sandgate_fleet_redis_replaced",
            "Times redis was found flushed or replaced (its fleet epoch gone or changed)",
            g.redis_replaced(),
        )
        yield CounterMetricFamily(
            "sandgate_front_tunnels",
            "TLS tunnels the passthrough front passed through itself (outside mitmproxy's layers)",
            g.front_spliced(),
        )
        yield CounterMetricFamily(
            "sandgate_front_handoffs",
            "Explicit-listener connections the passthrough front handed to mitmproxy",
            g.front_handed_off(),
        )
        broken = GaugeMetricFamily(
            "sandgate_policy_file_errors",
            "Policy files that did not load (1 each); kept=true: the tenant's last good version is served",
            labels=["file", "tenant", "kept"],
        )
        for file, tenant, kept in g.policy_problems():
            broken.add_metric([file, tenant, "true" if kept else "false"], 1)
        yield broken
        yield GaugeMetricFamily(
            "sandgate_grants_in_force", "Grants an approval made that are in force now", g.grants_in_force()
        )
        yield from _sink_families(g.audit_sinks())


def _sink_families(sinks: Iterable[SinkFigures]) -> Iterator[Metric]:
    """The SIEM sinks' counters and gauges, one sample per sink (labels sink, type)."""
    labels = ["sink", "type"]
    spooled = CounterMetricFamily(
        "sandgate_audit_sink_spooled", "Records queued for a SIEM sink", labels=labels
    )
    delivered = CounterMetricFamily(
        "sandgate_audit_sink_delivered", "Events a SIEM sink's receiver acknowledged", labels=labels
    )
    retried = CounterMetricFamily(
        "sandgate_audit_sink_retried", "Events sent again after a failed attempt", labels=labels
    )
    dropped = CounterMetricFamily(
        "sandgate_audit_sink_dropped",
        "Not delivered: why=full records the full queue did not take (they stay in the local "
        "trail), why=rejected events the receiver refused for good",
        labels=[*labels, "why"],
    )
    queued = GaugeMetricFamily(
        "sandgate_audit_sink_queue_bytes", "Bytes of records queued and not yet acknowledged", labels=labels
    )
    oldest = GaugeMetricFamily(
        "sandgate_audit_sink_oldest_undelivered_seconds",
        "Age of the oldest event not yet acknowledged (0: none waiting)",
        labels=labels,
    )
    for f in sinks:
        key = [f.name, f.kind]
        spooled.add_metric(key, f.spooled)
        delivered.add_metric(key, f.delivered)
        retried.add_metric(key, f.retried)
        dropped.add_metric([*key, "full"], f.dropped_full)
        dropped.add_metric([*key, "rejected"], f.rejected)
        queued.add_metric(key, f.queue_bytes)
        oldest.add_metric(key, f.oldest_seconds)
    yield from (spooled, delivered, retried, dropped, queued, oldest)


class Metrics:
    """The gateway's metrics; `attach` binds the scrape-time gauges of the running gateway."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._decisions = Counter(
            "sandgate_decisions",
            "Decisions by tenant, reason code, phase and verdict",
            ["tenant", "reason", "phase", "decision"],
            registry=self.registry,
        )
        self._decision_seconds = Histogram(
            "sandgate_decision_seconds",
            "Time spent deciding",
            buckets=DECISION_BUCKETS,
            registry=self.registry,
        )
        self._upstream_seconds = Histogram(
            "sandgate_upstream_seconds",
            "Intercepted HTTP: request sent upstream to response headers",
            buckets=UPSTREAM_BUCKETS,
            registry=self.registry,
        )
        self._injections = Counter(
            "sandgate_credential_injections",
            "Credentials injected, by tenant and credential name",
            ["tenant", "credential"],
            registry=self.registry,
        )
        # Usage per tenant, as `sandgate usage` reads it per sandbox from the trail.
        self._tenant_bytes = Counter(
            "sandgate_tenant_bytes",
            "Bytes of decided exchanges by tenant and direction (up: from the guest, down: to "
            "it), counted when their record is written",
            ["tenant", "direction"],
            registry=self.registry,
        )
        self._approvals_held = Gauge(
            "sandgate_approvals_held",
            "Requests held open for an operator's decision (ask rules)",
            registry=self.registry,
        )
        self._approval_outcomes = Counter(
            "sandgate_approval_outcomes",
            "Held requests by how they ended: approved, denied, expired, client_gone, queue_full",
            ["outcome"],
            registry=self.registry,
        )
        # By tenant and how the wait ended; no sandbox label: sandboxes come and go without bound
        # (`sandgate audit stats` has them per sandbox, from the trail).
        self._approval_wait = Histogram(
            "sandgate_approval_wait_seconds",
            "Time an access request waited for a decision, by tenant and outcome "
            "(approved, denied, expired, client_gone)",
            ["tenant", "outcome"],
            buckets=APPROVAL_WAIT_BUCKETS,
            registry=self.registry,
        )
        self._webhook_calls = Counter(
            "sandgate_approval_webhook_calls",
            "Approval webhook calls by result: delivered, retried (an attempt that failed and is "
            "tried again), failed (given up), dropped (the queue was full)",
            ["result"],
            registry=self.registry,
        )
        # Counted by the worker that holds the request (it decides), so the lead's sum of its
        # workers' counts each request once.
        self._approval_auto = Counter(
            "sandgate_approval_auto",
            "Automatic approval (approvals.auto) by result: approved, declined (waits for a "
            "person), not_applied (to approve, but the approval did not go through: waits too)",
            ["result"],
            registry=self.registry,
        )
        # The lean HTTP/1.1 path (interception.http1_path: lean): how much of the traffic it serves.
        self._lean_exchanges = Counter(
            "sandgate_http1_lean_exchanges",
            "Intercepted HTTP/1.1 exchanges the lean layer served",
            registry=self.registry,
        )
        self._lean_handovers = Counter(
            "sandgate_http1_lean_handovers",
            "Intercepted HTTP/1.1 connections the lean layer handed to mitmproxy's general path, by "
            "reason: partial_head (a head not complete in one read), over_caps, not_plain (an "
            "upgrade, Expect, trailers, a chunked request body, not HTTP/1.1 origin-form, ...)",
            ["reason"],
            registry=self.registry,
        )
        self._decision_children: dict[tuple[str, str, str, str], Counter] = {}
        self._injection_children: dict[tuple[str, str], Counter] = {}
        self._bytes_children: dict[tuple[str, str], Counter] = {}
        self._collector: _GatewayCollector | None = None

    def decision(self, tenant: str | None, reason: str, phase: str, verdict: str) -> None:
        """Count one decision."""
        key = (tenant or NO_TENANT, reason, phase, verdict)
        child = self._decision_children.get(key)
        if child is None:
            child = self._decision_children[key] = self._decisions.labels(*key)
        child.inc()

    def tenant_bytes(self, tenant: str | None, up: int | None, down: int | None) -> None:
        """Count one exchange's bytes each way (a refusal's are None or 0: nothing counted)."""
        for direction, n in (("up", up), ("down", down)):
            if n:
                key = (tenant or NO_TENANT, direction)
                child = self._bytes_children.get(key)
                if child is None:
                    child = self._bytes_children[key] = self._tenant_bytes.labels(*key)
                child.inc(n)

    def lean_exchange(self) -> None:
        """One exchange served by the lean HTTP/1.1 layer."""
        self._lean_exchanges.inc()

    def lean_handover(self, reason: str) -> None:
        """One connection the lean layer handed to the general path (see the counter's help)."""
        self._lean_handovers.labels(reason).inc()

    def approvals_held(self, held: int) -> None:
        """The number of requests held for approval now."""
        self._approvals_held.set(held)

    def approval_outcome(self, outcome: str) -> None:
        """Count one held (or refused) ask by how it ended."""
        self._approval_outcomes.labels(outcome).inc()

    def approval_wait(self, tenant: str, outcome: str, seconds: float) -> None:
        """The time one access request waited, observed when its wait ended."""
        self._approval_wait.labels(tenant, outcome).observe(seconds)

    def approval_auto(self, result: str) -> None:
        """Count one access request the automatic approval looked at, by its result."""
        self._approval_auto.labels(result).inc()

    def webhook_call(self, result: str) -> None:
        """Count one approval webhook call (or attempt) by its result."""
        self._webhook_calls.labels(result).inc()

    def decision_seconds(self, seconds: float) -> None:
        self._decision_seconds.observe(seconds)

    def upstream_seconds(self, seconds: float) -> None:
        self._upstream_seconds.observe(seconds)

    def injected(self, tenant: str, credentials: Iterable[str]) -> None:
        """Count the credentials injected into one request."""
        for name in credentials:
            key = (tenant, name)
            child = self._injection_children.get(key)
            if child is None:
                child = self._injection_children[key] = self._injections.labels(*key)
            child.inc()

    def attach(self, gauges: GatewayGauges) -> None:
        """Read these gauges at scrape time (replacing a previous gateway's, in tests)."""
        self.detach()
        self._collector = _GatewayCollector(gauges)
        self.registry.register(self._collector)

    def detach(self) -> None:
        if self._collector is not None:
            self.registry.unregister(self._collector)
            self._collector = None

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """(name, labels, value) of every sample (for tests and `policy status`)."""
        for metric in self.registry.collect():
            for s in metric.samples:
                yield s.name, dict(s.labels), s.value


# One gateway per process: the addons and the admin API share this instance.
METRICS = Metrics()
