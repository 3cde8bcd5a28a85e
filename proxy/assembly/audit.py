"""The audit trail's builder: its sinks (file or the workers' collector, stdout, the fleet
stream, SIEM sinks), the records an earlier process's exit left, and the trail itself."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import structlog

from sandgate.proxy.audit.forward import ForwardSink, forward_interval
from sandgate.proxy.audit.intents import IntentJournal
from sandgate.proxy.audit.leftovers import settle_dead_processes
from sandgate.proxy.audit.redis_stream import RedisStreamSink
from sandgate.proxy.audit.sinks.build import build_sinks
from sandgate.proxy.audit.sinks.courier import Courier
from sandgate.proxy.audit.sinks.fanout import Fanout
from sandgate.proxy.audit.sinks.sink import SiemSink
from sandgate.proxy.audit.spool import Spool
from sandgate.proxy.audit.trail import AuditLog, AuditSink, StdoutSink, audit_file_sink
from sandgate.proxy.config import GatewayConfig, RedisConfig
from sandgate.proxy.redis.client import Keys, connect_sync

__all__ = ["AuditParts", "build_audit"]

log = structlog.get_logger("sandgate.runtime")


@dataclass(frozen=True)
class AuditParts:
    """What the gateway keeps of its audit trail."""

    log: AuditLog
    # A worker's hand-off to the collector, told when the supervisor is gone (None: one process).
    forward: ForwardSink | None
    # Records written at start for requests a process's exit cut (with workers: the supervisor's).
    cut_at_start: int
    # SIEM sinks this process feeds (one process; with workers the supervisor's collector does).
    siem: tuple[SiemSink, ...] = ()


def build_audit(config: GatewayConfig) -> AuditParts:
    """The trail, not started; a gateway of one process first writes what earlier ones left."""
    sinks: list[AuditSink] = [file_sink(config)]
    # SIEM sinks at the one writer: here for one process; with workers, at the collector.
    siem = build_sinks(config, side="writer") if config.worker.count == 1 else []
    cut = settle_at_start(config, Fanout(sinks[0], siem)) if config.worker.count == 1 else 0
    if config.audit.stdout:
        sinks.append(StdoutSink())
    if config.redis is not None:
        sinks.append(stream_sink(config, config.redis))
    sinks.extend(siem)
    if siem:
        # Delivered by a process of its own, not on this one's interpreter lock; closed last,
        # after the queues took the last records.
        sinks.append(Courier(config))
    trail = AuditLog(
        sinks,
        queue_size=config.audit.queue_size,
        max_wait=config.audit.max_wait_seconds,
        acknowledge=config.audit.fsync == "per_batch",
        # Which of several workers decided: one trail, and the record still says where.
        stamp={"worker": config.worker.index} if config.worker.count > 1 else None,
        # What goes upstream is on disk before it goes, until its record is written.
        journal=IntentJournal(config.worker_dir),
    )
    forward = next((s for s in sinks if isinstance(s, ForwardSink)), None)
    return AuditParts(trail, forward, cut, tuple(siem))


def file_sink(config: GatewayConfig) -> AuditSink:
    """The audit file; a worker of several forwards to the supervisor's collector, its one
    writer (spooling in its own folder once the supervisor is gone)."""
    role = config.worker
    if role.count > 1:
        return ForwardSink(
            config.audit_socket_path,
            f"w{role.index}",
            spool=Spool(config.worker_dir),
            interval=forward_interval(config.audit.fsync),
        )
    return audit_file_sink(config)


def settle_at_start(config: GatewayConfig, sink: AuditSink) -> int:
    """A gateway of one process writes what its earlier processes left (spools, intents cut by
    their exit) before its own records; how many records were cut by an exit."""
    try:
        return settle_dead_processes(config.state_path, config.audit_path, sink.write).cut
    except OSError as e:
        log.error("audit.settle_failed", error=e.strerror)  # left for the next start
        return 0


def stream_sink(config: GatewayConfig, rcfg: RedisConfig) -> RedisStreamSink:
    """The fleet audit stream, spooling under the state dir while redis is away."""
    return RedisStreamSink(
        connect_sync(rcfg),
        Keys(rcfg.prefix),
        config.stream_spool_path,
        maxlen=rcfg.audit_stream_maxlen,
        dedupe_ttl=config.audit.stream_dedupe_ttl_seconds,
        gateway=config.audit.gateway_name or socket.gethostname(),
    )
