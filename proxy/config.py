"""The operator's gateway config (`sandgate run --config FILE`); every field has an embedded default.

With no file: an explicit proxy on 127.0.0.1:8080, rules from ./rules, the system resolver,
state (CA, audit) under ~/.sandgate. Relative paths are resolved against the config file's
folder (or the working directory when there is no file).
"""

from __future__ import annotations

import ipaddress
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandgate.policy.addresses import parse_network
from sandgate.policy.errors import HostError, PolicyLoadError
from sandgate.policy.hosts import normalise_host
from sandgate.policy.model.yamlsource import YamlDocument, load_yaml, validate
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.state.statusfile import STATUS_FILE
from sandgate.proxy.state.table_name import default_table
from sandgate.proxy.state.unix_sockets import internal_socket_folder
from sandgate.proxy.worker_role import SINGLE, WorkerRole

__all__ = [
    "AdminConfig",
    "AgentProtocolsConfig",
    "ApprovalsConfig",
    "AuditConfig",
    "ConnectionsConfig",
    "ConsoleConfig",
    "DnsListenerConfig",
    "ElasticsearchSinkConfig",
    "GatewayConfig",
    "GraphqlBoundsConfig",
    "HeadsConfig",
    "HecSinkConfig",
    "Http2Config",
    "LimitsSyncConfig",
    "ListenerConfig",
    "OtlpSinkConfig",
    "PassthroughConfig",
    "RedisConfig",
    "ResolverConfig",
    "SinkConfig",
    "SinkTlsConfig",
    "SyslogSinkConfig",
    "TransparentConfig",
    "WebSocketConfig",
    "WorkersConfig",
    "for_worker",
    "load_config",
    "split_listen",
]

Port = Annotated[int, Field(ge=0, le=65535)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenerConfig(_Strict):
    """One guest-facing listener."""

    mode: Literal["regular", "transparent"] = Field(
        default="regular",
        description=(
            "regular: an explicit HTTP proxy (guests send CONNECT or absolute URLs, with "
            "Proxy-Authorization); transparent: connections the host's nftables rules redirect here, "
            "each sandbox known by its source address"
        ),
    )
    # "*": every address, IPv4 and IPv6 (a socket per family; IPv6 sandbox guests need it).
    host: str = "127.0.0.1"
    port: Port = Field(
        default=8080,
        description=(
            "TCP port; 0: any free port. `sandgate run --port N` sets it for the one regular "
            "listener. With N workers, worker i of a transparent listener takes port + i (so not 0)"
        ),
    )

    @property
    def spec(self) -> str:
        if self.host == "*":
            return f"{self.mode}@{self.port}"  # mitmproxy: no host is every host, both families
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.mode}@{host}:{self.port}"


class ResolverConfig(_Strict):
    """How the gateway resolves names: static hosts first, then nameservers or the system."""

    hosts: dict[str, list[str]] = Field(default_factory=dict, description="static name → addresses")
    nameservers: list[str] = Field(default_factory=list, description="'ip' or 'ip:port'; empty = system")
    timeout: Annotated[float, Field(gt=0, le=30)] = Field(
        default=2.0,
        description="seconds one lookup at the nameservers may take; unused with the system resolver",
    )
    min_ttl: Annotated[float, Field(ge=0)] = Field(
        default=0.0, description="seconds an answer is cached at least, even when its TTL is shorter"
    )
    max_ttl: Annotated[float, Field(ge=0)] = Field(
        default=300.0,
        description="seconds an answer is cached at most, whatever its TTL; 0: nothing is cached",
    )
    system_ttl: Annotated[float, Field(ge=0)] = Field(
        default=30.0,
        description=(
            "seconds an answer of the system resolver (which gives no TTL) is taken to live, "
            "before min_ttl and max_ttl apply"
        ),
    )
    ipv6: bool = Field(
        default=True,
        description=(
            "ask the nameservers for AAAA records too; false: IPv4 addresses only. Unused with the "
            "system resolver"
        ),
    )


class AddressGuardConfig(_Strict):
    """The operator's address guard (policy/address_guard.py). What it never opens: the gateway's own
    addresses, unspecified, multicast, broadcast and metadata addresses. Every other
    non-public address (private, CGNAT, ULA, loopback, link-local, reserved) only inside
    these ranges."""

    reachable_by_name: list[str] = Field(
        default_factory=list,
        description=(
            "non-public ranges any tenant may reach through a name one of its rules names explicitly "
            "(an internal mirror); never by raw IP, never through hosts: ['*']"
        ),
    )
    tenant_reachable: list[str] = Field(
        default_factory=list,
        description=(
            "non-public ranges a tenant may reach where its own cidr rule (one with no public "
            "address in it) covers the address too, by IP or by name; a tenant rule alone opens nothing"
        ),
    )
    own_addresses: list[str] | Literal["auto"] = Field(
        default="auto",
        description=(
            "the gateway's own addresses; 'auto' reads every address of every interface and follows "
            "changes (netlink events, and a re-read every refresh_seconds)"
        ),
    )
    refresh_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=10.0, description="with own_addresses: auto, how often interfaces are re-read anyway"
    )

    @field_validator("reachable_by_name", "tenant_reachable")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        for text in v:
            try:
                parse_network(text)
            except HostError as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("own_addresses")
    @classmethod
    def _addresses(cls, v: list[str] | Literal["auto"]) -> list[str] | Literal["auto"]:
        if v != "auto":
            for text in v:
                try:
                    ipaddress.ip_address(text)
                except ValueError:
                    raise ValueError(f"not an IP address: {text!r}") from None
        return v


class SinkTlsConfig(_Strict):
    """TLS towards a SIEM sink's receiver."""

    ca_file: str | None = Field(
        default=None,
        description="CA bundle (PEM) the receiver's certificate must chain to; default: the system's",
    )
    client_cert: str | None = Field(
        default=None, description="client certificate (PEM), for receivers that ask for one"
    )
    client_key: str | None = Field(default=None, description="the client certificate's key (PEM, mode 0600)")
    verify: bool = Field(
        default=True,
        description=(
            "check the receiver's certificate and name (false only in a lab: a forged receiver "
            "would get every event)"
        ),
    )

    @model_validator(mode="after")
    def _key_with_cert(self) -> SinkTlsConfig:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("tls: client_cert and client_key go together")
        return self


class _SinkConfig(_Strict):
    """What every SIEM sink has: a name, a format, its disk queue and its pace."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")] = Field(
        description=(
            "unique; names the sink's queue folder (<state_dir>/audit/sinks/<name>/), its logs and metrics"
        )
    )
    format: Literal["ocsf", "native"] = Field(
        default="ocsf",
        description="ocsf: OCSF 1.8.0 events rendered from each record; native: the trail record itself",
    )
    max_spool_bytes: Annotated[int, Field(ge=65_536)] = Field(
        default=1024 * 1024 * 1024,
        description="bytes of records the sink's disk queue may hold undelivered (default 1 GiB)",
    )
    when_full: Literal["drop_newest", "block"] = Field(
        default="drop_newest",
        description=(
            "a full queue: drop_newest keeps what is queued and skips new records for this sink "
            "(counted, logged; the local trail keeps them); block holds the audit writer until "
            "there is room, so decisions wait and then deny (the SIEM gets everything)"
        ),
    )
    batch_size: Annotated[int, Field(ge=1, le=10_000)] = Field(
        default=500, description="records sent per request (or syslog connection); default 500"
    )
    timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        default=10.0,
        description="connect, send and acknowledgement timeout per batch, in seconds (default 10)",
    )
    max_backoff_seconds: Annotated[float, Field(gt=0)] = Field(
        default=30.0,
        description=(
            "longest wait between two attempts, in seconds (default 30; exponential from 0.5 s, with jitter)"
        ),
    )
    linger_seconds: Annotated[float, Field(ge=0, le=60)] = Field(
        default=1.0,
        description=(
            "how long a batch that is not full waits for more records before it is sent, in "
            "seconds (default 1; 0: at once, one send per few records, costly under load)"
        ),
    )


class SyslogSinkConfig(_SinkConfig):
    """RFC 5424 syslog over TCP (octet counting, RFC 6587), optionally TLS (RFC 5425)."""

    type: Literal["syslog"]
    host: str = Field(description="the receiver's name or address")
    port: Port = Field(default=6514, description="the receiver's TCP port (6514: syslog over TLS)")
    tls: SinkTlsConfig | None = Field(default=None, description="set to speak TLS; unset: plain TCP")
    facility: Annotated[int, Field(ge=0, le=23)] = Field(
        default=16, description="syslog facility of every message (default 16: local0)"
    )
    app_name: Annotated[str, Field(pattern=r"^[!-~]{1,48}$")] = Field(
        default="sandgate", description="APP-NAME of every message (default sandgate)"
    )


class _HttpSinkConfig(_SinkConfig):
    url: str = Field(description="the receiver's base URL (http:// or https://), without the API path")
    tls: SinkTlsConfig = Field(default_factory=SinkTlsConfig, description="TLS for an https:// url")

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url: use http://HOST[:PORT][/PATH] or https://...")
        if parts.username or parts.password:
            raise ValueError("url: no credentials in the URL; use the sink's credential reference")
        return v.rstrip("/")


class OtlpSinkConfig(_HttpSinkConfig):
    """OTLP/HTTP logs: protobuf ExportLogsServiceRequest POSTed to <url>/v1/logs."""

    type: Literal["otlp"]
    headers: dict[str, str] = Field(default_factory=dict, description="plain headers sent with every export")
    secret_headers: dict[str, str] = Field(
        default_factory=dict,
        description="headers whose values are references (env:VAR or file:PATH), e.g. Authorization",
    )


class HecSinkConfig(_HttpSinkConfig):
    """Splunk HTTP Event Collector compatible: <url>/services/collector/event."""

    type: Literal["hec"]
    token: str = Field(
        description="HEC token reference (env:VAR or file:PATH); sent as `Authorization: Splunk`"
    )
    sourcetype: str = Field(
        default="sandgate:audit", description="sourcetype of every event (default sandgate:audit)"
    )
    index: str | None = Field(default=None, description="index of every event; default: the token's")


class ElasticsearchSinkConfig(_HttpSinkConfig):
    """Elasticsearch bulk API compatible: <url>/_bulk, one `create` per event, `_id` the event id."""

    type: Literal["elasticsearch"]
    index: str = Field(
        default="sandgate-audit", description="index or data stream the events go to (default sandgate-audit)"
    )
    api_key: str | None = Field(
        default=None, description="API key reference (env:VAR or file:PATH); sent as `Authorization: ApiKey`"
    )


SinkConfig = Annotated[
    SyslogSinkConfig | OtlpSinkConfig | HecSinkConfig | ElasticsearchSinkConfig,
    Field(discriminator="type"),
]


class AuditConfig(_Strict):
    """The audit trail: a rotated JSON-lines file, optionally mirrored to stdout."""

    path: str | None = Field(default=None, description="default: <state_dir>/audit/audit.jsonl")
    max_bytes: Annotated[int, Field(ge=4096)] = Field(
        default=100 * 1024 * 1024,
        description=(
            "the file is rotated once it reaches this many bytes (audit.jsonl.1 is the newest rotated file)"
        ),
    )
    backups: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=10, description="rotated files kept (audit.jsonl.1 to .N); the oldest goes at each rotation"
    )
    queue_size: Annotated[int, Field(ge=1)] = Field(
        default=10_000,
        description=(
            "records waiting for the writer thread; nothing goes upstream until its record has a place here"
        ),
    )
    max_wait_seconds: Annotated[float, Field(ge=0)] = Field(
        default=5.0,
        description=(
            "how long a decision waits for a place in a full queue before it is denied with "
            "internal_error; 0: no wait"
        ),
    )
    fsync: Literal["off", "per_batch"] = Field(
        default="off",
        description=(
            "per_batch: each batch is fsynced and a decision (an answered request) waits until "
            "its record is on disk; off: written by the writer thread at its pace, not fsynced"
        ),
    )
    stdout: bool = Field(default=False, description="also write every record to stdout, one JSON line each")
    checkpoint_records: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=1000,
        description=(
            "a signed checkpoint of the hash chain after this many records (`sandgate audit "
            "verify` checks each; fewer records between two bound what an undetected cut can take)"
        ),
    )
    checkpoint_seconds: Annotated[float, Field(gt=0, le=86_400)] = Field(
        default=60.0,
        description="and at the latest this many seconds after a record was written (and at close)",
    )
    # The fleet audit stream (used when `redis:` is set).
    stream_dedupe_ttl_seconds: Annotated[int, Field(ge=60)] = Field(
        default=86_400,
        description=(
            "how long the stream remembers a record id, so a spool replayed within this time adds "
            "no duplicates (costs redis ~100 bytes per record for that long)"
        ),
    )
    gateway_name: str | None = Field(
        default=None, description="this gateway's name in stream entries (`gw`); default: the host name"
    )
    sinks: list[SinkConfig] = Field(
        default_factory=list,
        description=(
            "SIEM sinks beside the trail (syslog, otlp, hec, elasticsearch), each with its own "
            "disk queue; see Sending the audit to a SIEM"
        ),
    )

    @field_validator("sinks")
    @classmethod
    def _unique_names(cls, v: list[SinkConfig]) -> list[SinkConfig]:
        names = [s.name for s in v]
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            raise ValueError(f"sinks: names must be unique ({', '.join(doubled)})")
        return v

    @field_validator("fsync", mode="before")
    @classmethod
    def _fsync_bool(cls, v: object) -> object:
        # `fsync: true|false` from configs written before per_batch existed.
        if isinstance(v, bool):
            return "per_batch" if v else "off"
        return v


class ShutdownConfig(_Strict):
    """What SIGTERM/SIGINT does: drain in-flight work, then stop."""

    drain_seconds: Annotated[float, Field(ge=0)] = Field(
        default=10.0,
        description="how long in-flight requests and tunnels may take to finish before they are cut",
    )


class UpstreamConfig(_Strict):
    """How the gateway talks to upstream servers."""

    trusted_ca: str | None = Field(
        default=None,
        description=(
            "PEM bundle trusted for upstream TLS; default: the system trust store "
            "($SSL_CERT_FILE, else OpenSSL's default CA file)"
        ),
    )


class PassthroughConfig(_Strict):
    """TLS tunnels the gateway passes through without intercepting."""

    require_sni: bool = Field(
        default=True,
        description=(
            "a passthrough tunnel to a host allowed by name needs a ClientHello whose SNI names that "
            "host (sni_mismatch otherwise); false admits clients that send no SNI, which lets them "
            "pick any site the pinned server hosts by its inner Host"
        ),
    )
    front: bool = Field(
        default=True,
        description=(
            "the explicit listener reads each connection first and passes allowed TLS tunnels through "
            "itself (the same decisions, records, caps and limits, without mitmproxy's layers: about "
            "three times the new tunnels per second); false leaves every connection to mitmproxy"
        ),
    )


class DnsListenerConfig(_Strict):
    """The guests' DNS listener (UDP and TCP); the host redirects guests' port 53 to it.
    `host: "*"` listens on every address, IPv4 and IPv6."""

    host: str = Field(default="127.0.0.1", description="the address to listen on; '*': every address")
    port: Port = Field(
        default=8053,
        description="UDP and TCP port; with N workers, worker i listens on port + i (so not 0 then)",
    )
    max_ttl: Annotated[int, Field(ge=0)] = Field(
        default=300,
        description="the longest TTL, in seconds, of an answer to a guest; a shorter resolved TTL is kept",
    )


class TransparentConfig(_Strict):
    """Transparent-mode name binding."""

    reroute: bool = Field(
        default=False,
        description=(
            "dial a name's pinned address even when the guest connected to an IP the gateway did "
            "not give it for that name (default: refuse with host_mismatch)"
        ),
    )
    binding_min_ttl: Annotated[float, Field(ge=0)] = Field(
        default=30.0,
        description=(
            "seconds a name the gateway gave a sandbox (a DNS answer) stays bound to its addresses at "
            "least, even past the answer's TTL: a client may connect a little after it ran out"
        ),
    )
    binding_max_ttl: Annotated[float, Field(ge=0)] = Field(
        default=3600.0, description="seconds such a binding is kept at most, whatever the answer's TTL"
    )


class CredentialsConfig(_Strict):
    """The credential broker."""

    placeholder_key: str | None = Field(
        default=None,
        description=(
            "reference to the key placeholders are minted from (env:VAR or file:PATH, 32+ bytes); "
            "default: <state_dir>/placeholder.key, created on first start. Every gateway of a fleet "
            "needs the same key so a sandbox's placeholders work on all of them"
        ),
    )
    # Stored credentials (`sandgate credentials set`, `secret: stored:NAME`).
    store_keys: str | None = Field(
        default=None,
        description=(
            "reference to the AES-256-GCM keys stored credentials are sealed with (file:PATH or env:VAR; "
            "one 'id:base64key' a line, newest last); default: <state_dir>/store.keys, created on first "
            "use without redis. Every gateway of a fleet needs the same keys"
        ),
    )
    stored_cache_seconds: Annotated[float, Field(gt=0)] = Field(
        default=300.0,
        description="seconds a cached stored value is trusted without a change event",
    )


class OpaServerConfig(_Strict):
    """An OPA server reached over its REST API (fleet mode)."""

    url: str = Field(
        default="http://127.0.0.1:8181", description="the OPA server's base URL; used with engine: opa"
    )
    timeout_seconds: Annotated[float, Field(gt=0, le=30)] = Field(
        default=0.5,
        description=(
            "seconds one call to the server may take; past it the decision fails closed (policy_error)"
        ),
    )
    token: str | None = Field(default=None, description="bearer token reference: env:VAR or file:PATH")


class RegoCacheConfig(_Strict):
    """The decision cache in front of the Rego engine: verdicts keyed on the input fields a policy reads."""

    size: Annotated[int, Field(ge=0)] = Field(
        default=10_000, description="verdicts kept (the least recently used goes first); 0: no cache"
    )
    ttl_seconds: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description=(
            "seconds a cached verdict is used; null: until the policy changes (embedded), 1 s (opa, "
            "whose policy may change under the gateway)"
        ),
    )


class RegoConfig(_Strict):
    """Which engine evaluates tenants' Rego (data.sandgate.decision)."""

    engine: Literal["embedded", "opa"] = Field(
        default="embedded",
        description=(
            "embedded: evaluated in the gateway process, one compiled bundle per tenant; opa: asked of "
            "the OPA server under rego.opa (policies pushed with `sandgate policy push`)"
        ),
    )
    opa: OpaServerConfig = Field(default_factory=OpaServerConfig)
    cache: RegoCacheConfig = Field(default_factory=RegoCacheConfig)
    max_loaded_bundles: Annotated[int, Field(ge=1)] = Field(
        default=1_000,
        description=(
            "tenants' compiled bundles the embedded engine keeps loaded (about 150 KB each; the least "
            "recently used goes first, and is loaded again on its next use)"
        ),
    )
    bundle_store: str | None = Field(
        default=None, description="a 0700 folder for compiled bundles that outlives the process"
    )


class RedisConfig(_Strict):
    """Shared state for a fleet of gateways. Off when unset: one machine needs no redis."""

    url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="redis://host:port/db, rediss://... (TLS) or unix:///path/to/socket",
    )
    password: str | None = Field(default=None, description="reference: env:VAR or file:PATH")
    prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")] = Field(
        default="sandgate:",
        description=(
            "put before every key and channel name; gateways sharing a redis and a prefix are one "
            "fleet, so one redis can hold several"
        ),
    )
    timeout_seconds: Annotated[float, Field(gt=0, le=30)] = Field(
        default=0.5,
        description=(
            "limit on connecting and on each command; a call past it fails and its caller fails "
            "closed (deny, keep cached state, spool the audit)"
        ),
    )
    max_connections: Annotated[int, Field(ge=2, le=1024)] = Field(
        default=32, description="connections one pooled client of a gateway process may open to redis"
    )
    max_staleness_seconds: Annotated[float, Field(gt=0)] = Field(
        default=300.0,
        description="how long sandboxes registered in redis are still served after redis is lost",
    )
    audit_stream_maxlen: Annotated[int, Field(ge=1000)] = Field(
        default=1_000_000,
        description=(
            "about how many entries the fleet audit stream (`<prefix>audit`) keeps; older ones are trimmed"
        ),
    )
    # The fleet registry and reload channel (proxy/fleet/registry_sync.py).
    gateway_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")] | None = Field(
        default=None,
        description="this gateway's name in `policy status` (default: host name + a digest of state_dir)",
    )
    sync_interval_seconds: Annotated[float, Field(gt=0, le=60)] = Field(
        default=1.0, description="how often the fleet version is checked (catches missed reload messages)"
    )


class LimitsSyncConfig(_Strict):
    """How often tenants' `limits:` counts are shared with the fleet's other gateways (or the
    gateway's other workers); a single process needs nothing here. Written `limits:` with
    `sync_interval_seconds` before (still read, with a warning)."""

    interval_seconds: Annotated[float, Field(gt=0, le=10)] = Field(
        default=0.2,
        description=(
            "fleet mode: how often each gateway adds its counts to redis and reads the fleet's back; "
            "the bounded overshoot of a limit is what other gateways let through in about this long"
        ),
    )


class ConnectionsConfig(_Strict):
    """Hardening: how many guest connections one source or sandbox may hold, and for how long idle.

    See proxy/addons/connection_limits.py (what each cap counts, eviction, workers); connections
    closed at connect or reclaimed are audited per source and second, not one record per
    connection (a flood must not become an audit flood).
    """

    idle_timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        default=60.0,
        description=(
            "a connection with no request in flight and no byte either way for this long is closed; "
            "covers a new connection that never sends its first byte"
        ),
    )
    tunnel_idle_timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        default=600.0,
        description=(
            "passthrough TLS, raw TCP and upgraded connections (whose requests the gateway cannot see), "
            "and requests waiting on an upstream: closed after this long without a byte"
        ),
    )
    max_per_source: Annotated[int, Field(ge=0)] = Field(
        default=256,
        description=(
            "open connections from one source address (an IPv6 /64) that have not identified "
            "themselves yet, for the whole gateway (each of N workers: ceil(this / N)); a new one "
            "past it closes the source's oldest idle one; 0: no cap"
        ),
    )
    max_per_sandbox: Annotated[int, Field(ge=0)] = Field(
        default=512,
        description=(
            "open identified connections of one sandbox, for the whole gateway (transparent: at "
            "connect, on the one worker its traffic is steered to; explicit proxy: once its "
            "Proxy-Authorization is checked, each of N workers ceil(this / N), then 429); a busy "
            "build's parallel downloads fit; 0: no cap"
        ),
    )
    max_held_bytes: Annotated[int, Field(ge=64 * 1024)] = Field(
        default=1024 * 1024,
        description=(
            "bytes of one connection the gateway holds while a hook decides (a name lookup, an "
            "OPA query, a TLS decision); past it, reading that connection pauses (proxy/mitm/backpressure.py)"
        ),
    )
    listen_backlog: Annotated[int, Field(ge=16, le=65535)] = Field(
        default=1024,
        description=(
            "the guest listeners' accept queue (capped by net.core.somaxconn); mitmproxy's 100 "
            "overflows under a burst of connects and every dropped SYN waits a 1 s retransmit"
        ),
    )
    fd_headroom_percent: Annotated[float, Field(ge=2, le=50)] = Field(
        default=10.0,
        description=(
            "file descriptors each process keeps for upstream connections, the audit, redis and the "
            "admin API: past (100 - this) % of its RLIMIT_NOFILE (and never closer than 512 to it) a "
            "source holding 4 or more unidentified connections trades its oldest idle one for a new "
            "one, past (100 - this / 2) % (never closer than 256) every new connection takes the place "
            "of the oldest idle unidentified one, and is closed when there is none"
        ),
    )


class HeadsConfig(_Strict):
    """Caps on an HTTP/1 head (request or status line plus header lines) and on reading one."""

    max_bytes: Annotated[int, Field(ge=1024, le=16 * 1024 * 1024)] = Field(
        default=64 * 1024,
        description="a request head over this is answered 431, a response head 502; both close",
    )
    max_lines: Annotated[int, Field(ge=8, le=10_000)] = Field(
        default=100, description="lines in one head, the request or status line included"
    )
    read_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=20.0,
        description=(
            "time to read a whole request head, from its first byte (the first request of a "
            "connection or tunnel: from its start); then 408 and close"
        ),
    )


class WebSocketConfig(_Strict):
    """Caps on intercepted WebSocket sessions (proxy/mitm/websocket_guard.py)."""

    max_message_bytes: Annotated[int, Field(ge=1024, le=256 * 1024 * 1024)] = Field(
        default=4 * 1024 * 1024,
        description=(
            "one message (all its fragments, inflated), either way; a message passing it closes the "
            "session (1009 to its sender, 1001 to the other side) before more of it is buffered"
        ),
    )


# The most a decided body may be: bodies up to it are buffered whole before any hook lets
# them go (mitmproxy's `stream_large_bodies` and the credential broker's buffer are 1 MiB);
# a larger one would stream upstream before it was decided.
_MAX_DECIDED_BODY = 1024 * 1024


class GraphqlBoundsConfig(_Strict):
    """How much of a GraphQL query a `graphql:` rule reads (sandgate.policy.protocols.graphql_ops)."""

    max_query_bytes: Annotated[int, Field(ge=1024, le=_MAX_DECIDED_BODY)] = Field(
        default=64 * 1024, description="a query text over this is `invalid_request` (too_large)"
    )
    max_tokens: Annotated[int, Field(ge=100, le=100_000)] = Field(
        default=10_000, description="a query of more tokens is `invalid_request` (too_many_tokens)"
    )
    max_nesting: Annotated[int, Field(ge=2, le=64)] = Field(
        default=64,
        description=(
            "brackets nested deeper in a query are `invalid_request` (too_deep); at most 64, so "
            "the recursive parser never meets Python's recursion limit"
        ),
    )
    max_batch: Annotated[int, Field(ge=1, le=64)] = Field(
        default=16, description="requests in one GraphQL batch (an array); more are `invalid_request`"
    )


class AgentProtocolsConfig(_Strict):
    """How much of a body, WebSocket message or list answer an `mcp:`, `jsonrpc:` or `graphql:`
    rule reads to decide it; past any bound it is `invalid_request`, never passed unread."""

    max_body_bytes: Annotated[int, Field(ge=1024, le=_MAX_DECIDED_BODY)] = Field(
        default=_MAX_DECIDED_BODY,
        description=(
            "a request body (encoded and decoded), a WebSocket message, a list answer or one of "
            "its server-sent events; over it: `invalid_request` (too_large), a list answer "
            "withheld. At most 1 MiB: bodies up to it are buffered whole before they are decided"
        ),
    )
    max_depth: Annotated[int, Field(ge=4, le=256)] = Field(
        default=64,
        description=(
            "JSON nesting (arrays and objects, the message itself counting 1, a tool's arguments 3); "
            "deeper: `invalid_request` (too_deep), found before the body is parsed"
        ),
    )
    max_batch: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=64, description="messages in one JSON-RPC batch (an array); more are `invalid_request`"
    )
    graphql: GraphqlBoundsConfig = Field(default_factory=GraphqlBoundsConfig)


class Http2Config(_Strict):
    """Hardening of intercepted HTTP/2 connections from guests (proxy/addons/h2_guard.py)."""

    max_concurrent_streams: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=100,
        description=(
            "SETTINGS_MAX_CONCURRENT_STREAMS announced to the guest, and the streams one connection may "
            "have in the gateway's hands at once (reset ones included until their work is done); a new "
            "stream past it is refused with REFUSED_STREAM"
        ),
    )
    max_resets: Annotated[int, Field(ge=1)] = Field(
        default=200,
        description="streams the guest resets (or the gateway refuses) per window before GOAWAY and close",
    )
    reset_window_seconds: Annotated[float, Field(gt=0, le=600)] = Field(
        default=10.0, description="the sliding window, in seconds, over which max_resets is counted"
    )


class AdminConfig(_Strict):
    """The admin API (and /metrics): a unix socket by default, never a guest-facing listener."""

    enabled: bool = Field(
        default=True,
        description=(
            "false: no admin API and no /metrics, so approvals.auto must stay off; `sandgate policy "
            "reload` then sends SIGHUP and cannot confirm the outcome"
        ),
    )
    socket: str | None = Field(default=None, description="default: <state_dir>/admin.sock (mode 0600)")
    listen: str | None = Field(default=None, description="also serve on host:port (needs a token)")
    token: str | None = Field(
        default=None, description="bearer token reference (env:VAR or file:PATH); required with listen"
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str | None) -> str | None:
        if v is not None:
            split_listen(v)
        return v

    @model_validator(mode="after")
    def _token_for_tcp(self) -> AdminConfig:
        if self.listen is not None and self.token is None:
            raise ValueError(
                "admin.listen needs admin.token (env:VAR or file:PATH): TCP requests must carry it"
            )
        return self


class ConsoleConfig(_Strict):
    """The operator's web console, served under /console/ on the admin TCP listener."""

    enabled: bool = Field(
        default=False,
        description="serve the console (needs admin.listen and admin.token: its login is the token)",
    )
    session_ttl_seconds: Annotated[float, Field(gt=0, le=7 * 86400)] = Field(
        default=8 * 3600, description="a login lasts this long (sessions are in memory: a restart ends them)"
    )
    max_stream_clients: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=20,
        description="open live-decision streams at most; more are refused (503), a slow one is dropped",
    )
    login_attempts_per_minute: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=10, description="failed logins allowed per client address per minute; more are refused (429)"
    )


def split_listen(text: str) -> tuple[str, int]:
    """(host, port) from `host:port` or `[v6]:port`; ValueError naming the expected form."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port (for example 127.0.0.1:9180), got {text!r}")
    return host, int(port)


class HostRulesConfig(_Strict):
    """The nftables table `sandgate sandbox add` owns (one per gateway state directory)."""

    # None: `sandgate_<8 hex of sha256(realpath(state_dir))>` (GatewayConfig.nft_table).
    table: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")] | None = None


class InterceptionConfig(_Strict):
    """How intercepted (decrypted) traffic is served inside mitmproxy."""

    http1_path: Literal["general", "lean"] | None = Field(
        default=None,
        description=(
            "intercepted HTTP/1.1 exchanges: 'lean', sandgate's lean HTTP/1.1 layer (the same "
            "hooks and addons, about 1.6x the requests per core; what it does not serve, from an "
            "upgrade to a chunked upload, goes to the general path); 'general', mitmproxy's HTTP "
            "layer for every exchange; unset: $SANDGATE_HTTP1_PATH, else 'lean'"
        ),
    )


class WorkersConfig(_Strict):
    """How many gateway processes serve (proxy/workers/): one per core by default."""

    count: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] | None = Field(
        default=None,
        description=(
            "gateway processes under one supervisor; 'auto': one per core this process may run on; "
            "unset: $SANDGATE_WORKERS, else one per core (`sandgate run --workers N` wins over both)"
        ),
    )
    restart_backoff_seconds: Annotated[float, Field(gt=0, le=60)] = Field(
        default=0.5, description="wait before restarting a worker that died; doubles per quick death"
    )
    max_backoff_seconds: Annotated[float, Field(gt=0, le=600)] = Field(
        default=30.0, description="the longest wait between restarts of one worker"
    )
    start_attempts: Annotated[int, Field(ge=1, le=100)] = Field(
        default=3,
        description=(
            "starts in a row a worker may fail before it served (a port it cannot bind) before the "
            "supervisor stops every worker and exits 1"
        ),
    )
    stop_margin_seconds: Annotated[float, Field(ge=0, le=600)] = Field(
        default=5.0,
        description="on SIGTERM: how long past shutdown.drain_seconds a worker may take before it is killed",
    )


class WebhookConfig(_Strict):
    """A signed POST per new access request (sandgate.proxy.approvals.webhook)."""

    url: str = Field(description="http:// or https:// URL the gateway POSTs each new access request to")
    secret: str = Field(
        description="HMAC-SHA256 key reference (env:VAR or file:PATH, 16+ bytes); signs every call"
    )
    timeout_seconds: Annotated[float, Field(gt=0, le=60)] = Field(
        default=5.0, description="one attempt's limit (connect to answer)"
    )
    max_attempts: Annotated[int, Field(ge=1, le=20)] = Field(
        default=5, description="attempts per request (backoff 0.5 s doubling, at most 30 s between)"
    )
    queue: Annotated[int, Field(ge=1, le=100_000)] = Field(
        default=1000, description="calls waiting to be sent (per worker); past that, dropped and counted"
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("expected an http:// or https:// URL")
        return v


class ApprovalsConfig(_Strict):
    """Requests held for an operator's decision (`ask` rules, `sandgate requests`)."""

    ask_timeout_seconds: Annotated[float, Field(gt=0, le=86_400)] = Field(
        default=60.0, description="how long a request is held for a decision before 403 approval_timeout"
    )
    max_held_per_sandbox: Annotated[int, Field(ge=1, le=10_000)] = Field(
        default=8,
        description=(
            "requests one sandbox may have open at once (held, or hung up and not decided yet; per "
            "worker); more: 403 approval_queue_full"
        ),
    )
    webhook: WebhookConfig | None = Field(
        default=None, description="announce each new access request with a signed POST (off when unset)"
    )
    endpoint_name: str | None = Field(
        default="sandgate.internal",
        description=(
            "the name the gateway answers itself (plain HTTP, port 80): guests propose access "
            "requests at http://<name>/v1/access-requests; never resolved or forwarded; null: no endpoint"
        ),
    )
    endpoint_address: str = Field(
        default="169.254.77.77",
        description=(
            "the IPv4 address the DNS listener answers for endpoint_name (transparent mode): the guest "
            "routes it to the gateway, whose host rules steer it to the transparent listener"
        ),
    )
    proposals_per_minute: Annotated[int, Field(ge=1, le=10_000)] = Field(
        default=10, description="access requests one sandbox may propose per minute (per worker); more: 429"
    )
    grant_ttl_seconds: Annotated[float, Field(gt=0, le=31_536_000)] = Field(
        default=3600.0,
        description="how long a grant of scope `sandbox` allows when the approval names no --ttl",
    )
    grant_max_ttl_seconds: Annotated[float, Field(gt=0, le=31_536_000)] = Field(
        default=7 * 86_400.0,
        description="the longest a grant may allow (a longer --ttl is capped to it)",
    )
    auto: Literal["off", "within_ceiling"] = Field(
        default="off",
        description=(
            "within_ceiling: approve, without a person, an access request whose grant adds nothing "
            "outside the ceiling and touches none of its always_human entries nor a credential's host"
        ),
    )
    ceiling: str | None = Field(
        default=None, description="the ceiling file `auto` proves against; default: <rules_dir>/ceiling.yaml"
    )

    @field_validator("endpoint_name")
    @classmethod
    def _endpoint_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            normal = normalise_host(value)
        except HostError as e:
            raise ValueError(str(e)) from None
        if normal != value or "*" in normal or _is_address(normal):
            raise ValueError(f"{value!r}: a host name in lower case, not an address or a pattern")
        return value

    @field_validator("endpoint_address")
    @classmethod
    def _endpoint_address(cls, value: str) -> str:
        try:
            address = ipaddress.IPv4Address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IPv4 address") from None
        if address.is_unspecified or address.is_loopback or address.is_multicast:
            raise ValueError(f"{value!r}: a guest cannot route it to the gateway")
        return str(address)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class LogConfig(_Strict):
    """The gateway's own log, on stderr (the audit trail is apart)."""

    level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="the least severe lines written"
    )
    format: Literal["json", "console"] = Field(
        default="console",
        description="console: lines for people; json: one JSON object a line, for log shippers",
    )


class ReloadConfig(_Strict):
    """When the policy is loaded again besides SIGHUP and `sandgate policy reload`."""

    watch: bool = Field(
        default=True,
        description=(
            "reload when a watched file (policy files, token files, the sandbox registry) changes "
            "on disk; false: only on SIGHUP or `sandgate policy reload`"
        ),
    )
    interval_seconds: Annotated[float, Field(gt=0)] = Field(
        default=1.0,
        description=(
            "how often the watched files are checked; also how often credentials' secrets are read "
            "again and, on one machine, the stored-credentials file is polled"
        ),
    )
    # A changed file is loaded only after it held still this long (in-place writes pause).
    settle_seconds: Annotated[float, Field(ge=0)] = 1.0


class GatewayConfig(_Strict):
    """The whole gateway config."""

    listeners: list[ListenerConfig] = Field(default_factory=lambda: [ListenerConfig()], min_length=1)
    dns: DnsListenerConfig | None = Field(
        default=None, description="the guests' DNS listener (off when unset)"
    )
    transparent: TransparentConfig = Field(default_factory=TransparentConfig)
    host_rules: HostRulesConfig = Field(default_factory=HostRulesConfig)
    credentials: CredentialsConfig = Field(default_factory=CredentialsConfig)
    rego: RegoConfig = Field(default_factory=RegoConfig)
    rules_dir: str = Field(
        default="rules",
        description="the policy folder (base.yaml, presets/, tenants/); relative to the config file's folder",
    )
    # All or nothing: any broken policy file stops the start and fails every reload. Off: a
    # broken tenant file takes only its own tenant (`sandgate run --strict` turns it on).
    strict_policy: bool = False
    # $SANDGATE_HOME when set (the quick-start script and its messages use it too).
    state_dir: str = Field(default_factory=lambda: os.environ.get("SANDGATE_HOME") or "~/.sandgate")
    resolver: ResolverConfig = Field(default_factory=ResolverConfig)
    address_guard: AddressGuardConfig = Field(default_factory=AddressGuardConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    passthrough: PassthroughConfig = Field(default_factory=PassthroughConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    reload: ReloadConfig = Field(default_factory=ReloadConfig)
    redis: RedisConfig | None = Field(default=None, description="fleet mode's shared state (off when unset)")
    admin: AdminConfig = Field(default_factory=AdminConfig)
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    limits_sync: LimitsSyncConfig = Field(default_factory=LimitsSyncConfig)
    shutdown: ShutdownConfig = Field(default_factory=ShutdownConfig)
    connections: ConnectionsConfig = Field(default_factory=ConnectionsConfig)
    http2: Http2Config = Field(default_factory=Http2Config)
    heads: HeadsConfig = Field(default_factory=HeadsConfig)
    websocket: WebSocketConfig = Field(default_factory=WebSocketConfig)
    agent_protocols: AgentProtocolsConfig = Field(default_factory=AgentProtocolsConfig)
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    interception: InterceptionConfig = Field(default_factory=InterceptionConfig)
    approvals: ApprovalsConfig = Field(default_factory=ApprovalsConfig)
    # Filled in by load_config: the folder relative paths are resolved against.
    base_dir: str = Field(default=".", exclude=True)
    # Filled in by for_worker: this process's place among the gateway's workers.
    worker_index: int = Field(default=0, exclude=True)
    worker_count: int = Field(default=1, exclude=True)

    def path(self, value: str) -> Path:
        """A config path made absolute (with ~ expanded)."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    @property
    def rules_path(self) -> Path:
        return self.path(self.rules_dir)

    @property
    def state_path(self) -> Path:
        return self.path(self.state_dir)

    @property
    def ceiling_path(self) -> Path:
        """The ceiling automatic approval proves against (as `sandgate policy prove` reads it)."""
        return (
            self.path(self.approvals.ceiling) if self.approvals.ceiling else self.rules_path / "ceiling.yaml"
        )

    @model_validator(mode="after")
    def _auto_needs_admin(self) -> GatewayConfig:
        if self.approvals.auto != "off" and not self.admin.enabled:
            raise ValueError("approvals.auto approves through the admin API: it needs admin.enabled")
        return self

    @model_validator(mode="after")
    def _console_needs_tcp(self) -> GatewayConfig:
        if self.console.enabled and (not self.admin.enabled or self.admin.listen is None):
            raise ValueError(
                "console.enabled needs admin.listen and admin.token: the console is served on the "
                "admin TCP listener and its login is the admin token"
            )
        return self

    @property
    def worker(self) -> WorkerRole:
        """Which of the gateway's worker processes this config is for (SINGLE: no workers)."""
        return WorkerRole(self.worker_index, self.worker_count) if self.worker_count > 1 else SINGLE

    @property
    def worker_dir(self) -> Path:
        """This process's own files: the state dir itself, or its worker folder under workers."""
        role = self.worker
        return role.folder(self.state_path) if role.count > 1 else self.state_path

    @property
    def fleet_epoch_path(self) -> Path:
        return self.worker_dir / "fleet-epoch"

    @property
    def stream_spool_path(self) -> Path:
        folder = self.worker_dir if self.worker.count > 1 else self.state_path / "audit"
        return folder / "stream.spool"

    @property
    def audit_socket_path(self) -> Path:
        """Where the supervisor's audit collector takes the workers' batches."""
        return internal_socket_folder(self.state_path) / "audit.sock"

    @property
    def worker_suffix(self) -> str:
        """Appended to this process's fleet gateway id: each worker is a member of the fleet."""
        return f"-w{self.worker_index}" if self.worker.count > 1 else ""

    @property
    def ca_dir(self) -> Path:
        return self.state_path / "ca"

    @property
    def nft_table(self) -> str:
        """The host rules' nftables table: `host_rules.table`, else one derived from the state_dir."""
        return self.host_rules.table or default_table(self.state_path)

    @property
    def registry_path(self) -> Path:
        return self.state_path / "sandboxes.json"

    @property
    def placeholder_key_ref(self) -> str:
        return self.credentials.placeholder_key or f"file:{self.state_path / 'placeholder.key'}"

    @property
    def store_keys_ref(self) -> str:
        return (
            _anchor_reference(self, self.credentials.store_keys) or f"file:{self.state_path / 'store.keys'}"
        )

    @property
    def credentials_store_path(self) -> Path:
        return self.state_path / "credentials.sealed.json"

    @property
    def status_path(self) -> Path:
        """The gateway's status file; a worker's own in its folder (the supervisor writes the
        gateway's from them)."""
        return self.worker_dir / STATUS_FILE

    @property
    def admin_socket_path(self) -> Path:
        """The admin socket this process serves."""
        if not self.worker.lead:
            # A peer's private socket; the lead's is public.
            return internal_socket_folder(self.state_path) / f"w{self.worker.index}.sock"
        return self.gateway_admin_socket_path

    @property
    def gateway_admin_socket_path(self) -> Path:
        """The gateway's admin socket (the lead's, the operator's API), whichever worker asks."""
        return self.path(self.admin.socket) if self.admin.socket else self.state_path / "admin.sock"

    @property
    def audit_path(self) -> Path:
        return self.path(self.audit.path) if self.audit.path else self.state_path / "audit" / "audit.jsonl"


def for_worker(config: GatewayConfig, role: WorkerRole) -> GatewayConfig:
    """The config of worker `role` of a gateway with workers: transparent and DNS ports moved to
    base + index (the host rules steer each sandbox to one worker), its own files in its folder,
    and no admin TCP listener but the lead's. SINGLE leaves the config as it is."""
    if role.count <= 1:
        return config
    listeners = [
        lst.model_copy(update={"port": role.port(lst.port)}) if lst.mode == "transparent" else lst
        for lst in config.listeners
    ]
    update: dict[str, object] = {
        "listeners": listeners,
        "worker_index": role.index,
        "worker_count": role.count,
    }
    if config.dns is not None:
        update["dns"] = config.dns.model_copy(update={"port": role.port(config.dns.port)})
    if not role.lead:
        update["admin"] = config.admin.model_copy(update={"listen": None})
    return config.model_copy(update=update)


def load_config(path: Path | None) -> GatewayConfig:
    """The config from a file, or the embedded defaults; raises ConfigError with file:line."""
    if path is None:
        return GatewayConfig(base_dir=str(Path.cwd()))
    try:
        doc = _renamed_keys(load_yaml(path))
        config = validate(GatewayConfig, doc)
    except PolicyLoadError as e:
        raise ConfigError(str(e)) from None
    return _anchor_references(config.model_copy(update={"base_dir": str(path.resolve().parent)}))


# Config keys renamed, still read: (old path, new path), each a key under the top level.
RENAMED_KEYS: tuple[tuple[tuple[str, str], tuple[str, str]], ...] = (
    (("limits", "sync_interval_seconds"), ("limits_sync", "interval_seconds")),
)


def _renamed_keys(doc: YamlDocument) -> YamlDocument:
    """The document with renamed keys under their new names (a warning on stderr names the
    file, line and key); positions follow, so an error still points at what was written."""
    data = doc.data
    if not isinstance(data, dict):
        return doc
    positions = dict(doc.positions)
    for (old_section, old_key), (new_section, new_key) in RENAMED_KEYS:
        if old_section not in data:
            continue
        where = doc.locate((old_section,))
        if new_section in data:
            raise ConfigError(
                f"{where}: `{old_section}` is the old name of `{new_section}`: keep only `{new_section}`"
            )
        print(
            f"sandgate: warning: {where}: `{old_section}: {{{old_key}: ...}}` is deprecated; "
            f"write `{new_section}: {{{new_key}: ...}}` (the same setting)",
            file=sys.stderr,
        )
        section = data[old_section]
        if isinstance(section, dict):
            section = {new_key if k == old_key else k: v for k, v in section.items()}
        data = {
            (new_section if k == old_section else k): (section if k == old_section else v)
            for k, v in data.items()
        }
        for loc in list(positions):
            if loc[:1] == (old_section,):
                rest = loc[1:]
                if rest[:1] == (old_key,):
                    rest = (new_key, *rest[1:])
                positions[(new_section, *rest)] = positions.pop(loc)
    return replace(doc, data=data, positions=positions)


def _anchor_reference(config: GatewayConfig, reference: str | None) -> str | None:
    """A `file:` reference made absolute against the config's folder; others unchanged."""
    if reference is None:
        return None
    scheme, _, value = reference.partition(":")
    return f"file:{config.path(value)}" if scheme == "file" and value else reference


def _anchor_references(config: GatewayConfig) -> GatewayConfig:
    """Every `file:` reference of the config resolved like its other paths: against its folder,
    never against the working directory of whoever runs the gateway or the CLI."""
    creds, rego, admin = config.credentials, config.rego, config.admin
    update: dict[str, object] = {
        "credentials": creds.model_copy(
            update={
                "placeholder_key": _anchor_reference(config, creds.placeholder_key),
                "store_keys": _anchor_reference(config, creds.store_keys),
            }
        ),
        "rego": rego.model_copy(
            update={"opa": rego.opa.model_copy(update={"token": _anchor_reference(config, rego.opa.token)})}
        ),
        "admin": admin.model_copy(update={"token": _anchor_reference(config, admin.token)}),
    }
    hook = config.approvals.webhook
    if hook is not None:
        hook = hook.model_copy(update={"secret": _anchor_reference(config, hook.secret)})
        update["approvals"] = config.approvals.model_copy(update={"webhook": hook})
    if config.redis is not None:
        update["redis"] = config.redis.model_copy(
            update={"password": _anchor_reference(config, config.redis.password)}
        )
    return config.model_copy(update=update)
