"""The CA certificates the gateway trusts for upstream TLS.

`upstream.trusted_ca` when the config sets one; otherwise the host's system trust store, the
file OpenSSL reads by default (`$SSL_CERT_FILE`, or /etc/ssl/certs/ca-certificates.crt on
Debian, which `update-ca-certificates` keeps with the operator's own CAs), as curl, git and apt
on the same host use. mitmproxy on its own would use certifi's bundle, which ignores CAs the
operator installed: an internal mirror whose certificate the host trusts would be refused.
Only where no such file exists does the gateway fall back to certifi's bundle.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from sandgate.proxy.config import GatewayConfig

__all__ = ["upstream_trust_file"]


def upstream_trust_file(config: GatewayConfig) -> str | None:
    """The PEM bundle for upstream verification; None means mitmproxy's default (certifi)."""
    if config.upstream.trusted_ca:
        return str(config.path(config.upstream.trusted_ca))
    system = ssl.get_default_verify_paths().cafile
    return system if system and Path(system).is_file() else None
