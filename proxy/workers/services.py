"""What the supervisor runs for all its workers: the audit collector (with the SIEM sinks
behind the file) and, without redis, the limit relay.

The audit file has one writer: the supervisor's collector owns config.audit_path (rotation,
fsync) and each worker forwards its batches to it (proxy/audit/forward.py), so every `audit`
command reads one trail. Without `redis:`, the workers share limit counts through a private
redis-server on a unix socket (proxy/workers/limit_relay.py); with `redis:`, each worker is a
member of the fleet instead.
"""

from __future__ import annotations

import contextlib
from types import TracebackType

import structlog

from sandgate.proxy.audit.collector import AuditCollector
from sandgate.proxy.audit.leftovers import Settled, settle_dead_processes, write_cut_count
from sandgate.proxy.audit.sinks.build import build_sinks
from sandgate.proxy.audit.sinks.fanout import Fanout
from sandgate.proxy.audit.trail import audit_file_sink
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.fleet.limits_sync import RELAY_ENV
from sandgate.proxy.state.unix_sockets import ensure_private_folder
from sandgate.proxy.workers.limit_relay import LimitRelay

__all__ = ["SharedServices"]

log = structlog.get_logger("sandgate.workers")


class SharedServices:
    """Started before the workers, closed after the last one is gone (`with` closes them)."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.limit_relay: LimitRelay | None = None
        self.collector: AuditCollector | None = None
        self.cut_by_exit = 0  # records written for intents a dead worker left open

    def env(self) -> dict[str, str]:
        """What the workers' environment needs to reach these services."""
        return {RELAY_ENV: self.limit_relay.url} if self.limit_relay is not None else {}

    def start(self) -> SharedServices:
        """Start both; ListenerError or ConfigError (LimitRelayError) when one cannot start."""
        cfg = self.config
        # The internal sockets' folder (audit collector, limit relay, peers' admin APIs).
        ensure_private_folder(cfg.audit_socket_path.parent)
        file = audit_file_sink(cfg)
        try:
            # One queue per SIEM sink for the gateway: workers' batches and what is settled
            # from dead processes all pass here.
            sink = Fanout(file, build_sinks(cfg))
        except BaseException:
            file.close()
            raise
        try:
            sink.start()
            self.collector = AuditCollector(cfg.audit_socket_path, sink)
            # What an earlier gateway's processes left (killed, or orphaned by a supervisor
            # that was): in the trail before anything new is.
            write_cut_count(cfg.state_path, 0)
            self.settle()
            self.collector.start()
            if cfg.redis is None:
                self.limit_relay = LimitRelay(cfg.audit_socket_path.parent).start()
        except BaseException:
            self.close()
            raise
        return self

    def settle(self) -> Settled:
        """Write what processes that are gone left behind (spools, open intents) to the trail."""
        collector = self.collector
        if collector is None:
            return Settled()
        try:
            settled = settle_dead_processes(
                self.config.state_path, self.config.audit_path, collector.write_lines
            )
        except OSError as e:
            log.error("audit.settle_failed", error=e.strerror)  # left for the next try
            return Settled()
        if settled.cut:
            self.cut_by_exit += settled.cut
            try:
                write_cut_count(self.config.state_path, self.cut_by_exit)
            except OSError as e:
                log.warning("audit.cut_count_unwritten", error=e.strerror)
        return settled

    def close(self) -> None:
        """Stop the limit relay, then the collector (which closes the audit file)."""
        relay, self.limit_relay = self.limit_relay, None
        if relay is not None:
            with contextlib.suppress(Exception):
                relay.stop()
        collector, self.collector = self.collector, None
        if collector is not None:
            collector.close()
        folder = self.config.audit_socket_path.parent
        if folder.parent != self.config.state_path:
            # The /tmp fallback of a deep state dir: gone with the gateway once its sockets are.
            with contextlib.suppress(OSError):
                folder.rmdir()

    def __enter__(self) -> SharedServices:
        return self  # started already (start() reports its own failure)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
