"""sandgate brokers: secret sources, placeholders, credential injection and response scrubbing.

Pure Python on plain values (no mitmproxy import): the gateway's addon turns a flow into a
`BrokerRequest`, asks `Broker.plan`, applies the returned mutations, and runs the
response through `Broker.scrubber(tenant, sandbox)`.
"""

from sandgate.brokers.body_guard import RequestBodyGuard
from sandgate.brokers.broker import Broker
from sandgate.brokers.errors import (
    BrokerConfigError,
    BrokerError,
    KeyringError,
    SealingError,
    SecretReferenceError,
    SecretUnavailable,
    TokenEndpointError,
)
from sandgate.brokers.httpclient import AsyncHttpClient, HttpResponse, HttpxClient
from sandgate.brokers.outcome import BrokerAllow, BrokerDecision, BrokerDenial, DenialCause
from sandgate.brokers.placeholders import (
    PLACEHOLDER_PREFIX,
    PlaceholderIndex,
    PlaceholderMinter,
    PlaceholderOwner,
)
from sandgate.brokers.request import (
    AppliedRequest,
    BrokerRequest,
    Mutation,
    RemoveHeader,
    SetBody,
    SetHeader,
    SetQuery,
    apply_mutations,
)
from sandgate.brokers.scrub import Scrubber, StreamScrubber
from sandgate.brokers.sealing import (
    Keyring,
    Sealed,
    associated_data,
    format_key_line,
    new_key,
    next_key_id,
    parse_keyring,
)
from sandgate.brokers.secret import Secret
from sandgate.brokers.sources.registry import SecretRegistry, SecretSource, default_registry
from sandgate.brokers.sources.stored import StoredSource
from sandgate.brokers.tenant_credentials import TenantCredentials
from sandgate.policy.model.credentials import Credential
from sandgate.policy.model.secret_refs import SecretRef, parse_ref

__all__ = [
    "PLACEHOLDER_PREFIX",
    "AppliedRequest",
    "AsyncHttpClient",
    "Broker",
    "BrokerAllow",
    "BrokerConfigError",
    "BrokerDecision",
    "BrokerDenial",
    "BrokerError",
    "BrokerRequest",
    "Credential",
    "DenialCause",
    "HttpResponse",
    "HttpxClient",
    "Keyring",
    "KeyringError",
    "Mutation",
    "PlaceholderIndex",
    "PlaceholderMinter",
    "PlaceholderOwner",
    "RemoveHeader",
    "RequestBodyGuard",
    "Scrubber",
    "Sealed",
    "SealingError",
    "Secret",
    "SecretRef",
    "SecretReferenceError",
    "SecretRegistry",
    "SecretSource",
    "SecretUnavailable",
    "SetBody",
    "SetHeader",
    "SetQuery",
    "StoredSource",
    "StreamScrubber",
    "TenantCredentials",
    "TokenEndpointError",
    "apply_mutations",
    "associated_data",
    "default_registry",
    "format_key_line",
    "new_key",
    "next_key_id",
    "parse_keyring",
    "parse_ref",
]
