"""What the supervisor runs for all its workers: the audit collector and, without redis, the
local broker.

The audit file has one writer: the supervisor's collector owns config.audit_path (rotation,
fsync) and each worker forwards its batches to it (proxy/audit/forward.py), so every `audit`
command reads one trail. Without `redis:`, the workers share limit counts through a private
redis-server on a unix socket (proxy/fleet/local_broker.py); with `redis:`, each worker is a
member of the fleet instead.
"""

from __future__ import annotations

import contextlib
from types import TracebackType

from sandgate.proxy.audit.collector import AuditCollector
from sandgate.proxy.audit.trail import audit_file_sink
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.fleet.local_broker import ENV as BROKER_ENV
from sandgate.proxy.fleet.local_broker import LocalBroker
from sandgate.proxy.unix_sockets import ensure_private_folder

__all__ = ["SharedServices"]


class SharedServices:
    """Started before the workers, closed after the last one is gone (`with` closes them)."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.broker: LocalBroker | None = None
        self.collector: AuditCollector | None = None

    def env(self) -> dict[str, str]:
        """What the workers' environment needs to reach these services."""
        return {BROKER_ENV: self.broker.url} if self.broker is not None else {}

    def start(self) -> SharedServices:
        """Start both; ListenerError or ConfigError (LocalBrokerError) when one cannot start."""
        cfg = self.config
        # The internal sockets' folder (audit collector, local broker, peers' admin APIs).
        ensure_private_folder(cfg.audit_socket_path.parent)
        sink = audit_file_sink(cfg)
        try:
            self.collector = AuditCollector(cfg.audit_socket_path, sink)
            self.collector.start()
            if cfg.redis is None:
                self.broker = LocalBroker(cfg.audit_socket_path.parent).start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop the broker, then the collector (which closes the audit file)."""
        broker, self.broker = self.broker, None
        if broker is not None:
            with contextlib.suppress(Exception):
                broker.stop()
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
