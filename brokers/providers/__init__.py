"""Credentials that are made, not stored: OAuth2 and GitHub App tokens (cached until shortly
before expiry) and AWS SigV4 signing.
"""

from sandgate.brokers.providers.github_app import GitHubAppProvider, app_jwt
from sandgate.brokers.providers.oauth2 import OAuth2Provider
from sandgate.brokers.providers.sigv4 import (
    GuestSignature,
    SigV4Signature,
    amz_date,
    canonical_query,
    canonical_uri,
    parse_authorization,
    sign,
)
from sandgate.brokers.providers.token_cache import Token, TokenCache

__all__ = [
    "GitHubAppProvider",
    "GuestSignature",
    "OAuth2Provider",
    "SigV4Signature",
    "Token",
    "TokenCache",
    "amz_date",
    "app_jwt",
    "canonical_query",
    "canonical_uri",
    "parse_authorization",
    "sign",
]
