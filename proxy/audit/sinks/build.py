"""The configured SIEM sinks, built (credentials loaded, TLS contexts made), not started."""

from __future__ import annotations

from sandgate.proxy.audit.sinks.elasticsearch import BulkTransport
from sandgate.proxy.audit.sinks.figures import sink_folder
from sandgate.proxy.audit.sinks.hec import HecTransport
from sandgate.proxy.audit.sinks.otlp import OtlpTransport
from sandgate.proxy.audit.sinks.queue import Side
from sandgate.proxy.audit.sinks.sink import SiemSink
from sandgate.proxy.audit.sinks.syslog import SyslogTransport
from sandgate.proxy.audit.sinks.tlsconf import client_context, load_credential
from sandgate.proxy.audit.sinks.transport import Transport
from sandgate.proxy.config import (
    ElasticsearchSinkConfig,
    GatewayConfig,
    HecSinkConfig,
    OtlpSinkConfig,
    SinkConfig,
    SyslogSinkConfig,
)

__all__ = ["build_sinks"]


def build_sinks(config: GatewayConfig, side: Side = "both") -> list[SiemSink]:
    """One SiemSink per `audit.sinks` entry; ConfigError for a credential or TLS file.
    `side`: "writer" when a courier process delivers them, "reader" in that courier."""
    return [_sink(config, sc, side) for sc in config.audit.sinks]


def _sink(config: GatewayConfig, sc: SinkConfig, side: Side) -> SiemSink:
    return SiemSink(
        sc.name,
        sc.type,
        sink_folder(config, sc.name),
        transport(config, sc),
        fmt=sc.format,
        max_bytes=sc.max_spool_bytes,
        when_full=sc.when_full,
        batch_size=sc.batch_size,
        max_backoff=sc.max_backoff_seconds,
        linger=sc.linger_seconds,
        fsync=config.audit.fsync == "per_batch",
        side=side,
    )


def transport(config: GatewayConfig, sc: SinkConfig) -> Transport:
    """The transport a sink's config names."""
    what = f"audit.sinks[{sc.name}]"
    if isinstance(sc, SyslogSinkConfig):
        ctx = client_context(sc.tls, config, sc.name) if sc.tls is not None else None
        return SyslogTransport(
            sc.host,
            sc.port,
            context=ctx,
            timeout=sc.timeout_seconds,
            facility=sc.facility,
            app_name=sc.app_name,
        )
    ctx = client_context(sc.tls, config, sc.name)
    if isinstance(sc, OtlpSinkConfig):
        return OtlpTransport(
            sc.url,
            context=ctx,
            timeout=sc.timeout_seconds,
            headers=dict(sc.headers),
            secret_headers={
                k: load_credential(v, config, f"{what}.secret_headers.{k}")
                for k, v in sc.secret_headers.items()
            },
        )
    if isinstance(sc, HecSinkConfig):
        return HecTransport(
            sc.url,
            token=load_credential(sc.token, config, f"{what}.token"),
            context=ctx,
            timeout=sc.timeout_seconds,
            sourcetype=sc.sourcetype,
            index=sc.index,
        )
    assert isinstance(sc, ElasticsearchSinkConfig)
    return BulkTransport(
        sc.url,
        index=sc.index,
        api_key=load_credential(sc.api_key, config, f"{what}.api_key") if sc.api_key else None,
        context=ctx,
        timeout=sc.timeout_seconds,
    )
