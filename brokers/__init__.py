"""sandgate brokers: secret sources, placeholders, credential injection and response scrubbing.

Pure Python on plain values (no mitmproxy import): the gateway's addon turns a flow into a
`BrokerRequest`, asks `Broker.decide`, applies the returned mutations, and runs the
response through `Broker.scrubber(tenant, sandbox)`.
"""

from .binding import TenantCredentials
from .broker import Broker
from .errors import (
    BrokerConfigError,
    BrokerError,
    SecretReferenceError,
    SecretUnavailable,
    TokenEndpointError,
)
from .guard import RequestBodyGuard
from .httpclient import AsyncHttpClient, HttpResponse, HttpxClient
from .models import Credential
from .outcome import BrokerAllow, BrokerDecision, BrokerDenial, DenialCause
from .placeholders import PLACEHOLDER_PREFIX, PlaceholderIndex, PlaceholderMinter, PlaceholderOwner
from .refs import SecretRef, parse_ref
from .request import (
    AppliedRequest,
    BrokerRequest,
    Mutation,
    RemoveHeader,
    SetBody,
    SetHeader,
    SetQuery,
    apply_mutations,
)
from .scrub import Scrubber, StreamScrubber
from .secret import Secret
from .sources import SecretRegistry, SecretSource, default_registry

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
    "Mutation",
    "PlaceholderIndex",
    "PlaceholderMinter",
    "PlaceholderOwner",
    "RemoveHeader",
    "RequestBodyGuard",
    "Scrubber",
    "Secret",
    "SecretRef",
    "SecretReferenceError",
    "SecretRegistry",
    "SecretSource",
    "SecretUnavailable",
    "SetBody",
    "SetHeader",
    "SetQuery",
    "StreamScrubber",
    "TenantCredentials",
    "TokenEndpointError",
    "apply_mutations",
    "default_registry",
    "parse_ref",
]
