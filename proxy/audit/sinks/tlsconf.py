"""TLS contexts and credentials of SIEM sinks, from their config."""

from __future__ import annotations

import os
import ssl

from sandgate.brokers import Secret
from sandgate.proxy.config import GatewayConfig, SinkTlsConfig
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.stores.placeholder_key import load_placeholder_key

__all__ = ["client_context", "load_credential"]


def client_context(tls: SinkTlsConfig, config: GatewayConfig, sink: str) -> ssl.SSLContext:
    """A client context: the CA file (or the system's), an optional client certificate,
    verification on unless the config turns it off."""
    try:
        ctx = ssl.create_default_context(cafile=_path(config, tls.ca_file))
        if tls.client_cert is not None:
            ctx.load_cert_chain(_path(config, tls.client_cert) or "", _path(config, tls.client_key))
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"audit.sinks[{sink}].tls: {getattr(e, 'strerror', None) or e}") from None
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def load_credential(reference: str, config: GatewayConfig, what: str) -> Secret:
    """A sink's credential from `env:VAR` or `file:PATH` (relative to the config's folder)."""
    scheme, _, value = reference.partition(":")
    if scheme == "file" and value:
        reference = f"file:{config.path(value)}"
    if scheme == "env" and not os.environ.get(value):
        raise ConfigError(f"{what}: environment variable {value} is not set or empty")
    try:
        return load_placeholder_key(reference, create=False, min_bytes=1)
    except ConfigError as e:
        raise ConfigError(f"{what}: {str(e).replace('placeholder key ', '')}") from None


def _path(config: GatewayConfig, value: str | None) -> str | None:
    return str(config.path(value)) if value else None
