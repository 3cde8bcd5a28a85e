"""The credential model: each inject kind, and what a tenant file may not say."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sandgate.brokers import Credential

BASE: dict[str, Any] = {"name": "c", "secret": "env:KEY", "hosts": ["api.example.com"]}


@pytest.mark.parametrize(
    ("fields", "kind", "managed"),
    [
        ({"inject": {"header": "Authorization", "format": "Bearer {secret}"}}, "header", {"authorization"}),
        ({"inject": {"header": "X-Api-Key"}}, "header", {"x-api-key"}),
        ({"inject": {"basic": {"username": "deploy"}}}, "basic", {"authorization"}),
        ({"inject": {"basic": {}}}, "basic", {"authorization"}),
        ({"inject": {"query": "api_key"}}, "query", set()),
        ({"inject": {"body": True, "max_bytes": 4096}}, "body", set()),
        (
            {
                "inject": {
                    "aws_sigv4": {
                        "region": "eu-west-1",
                        "service": "s3",
                        "access_key_id": "AKIAIOSFODNN7EXAMPLE",
                    }
                }
            },
            "aws_sigv4",
            {"authorization", "x-amz-date", "x-amz-security-token"},
        ),
        (
            {
                "secret": None,
                "inject": {
                    "oauth2": {
                        "token_url": "https://auth.example.com/oauth/token",
                        "client_id": "id",
                        "client_secret": "file:/run/secrets/cs",
                        "scope": "read write",
                    }
                },
            },
            "oauth2",
            {"authorization"},
        ),
        (
            {
                "secret": None,
                "inject": {
                    "oauth2": {
                        "grant": "refresh_token",
                        "token_url": "http://127.0.0.1:9/token",
                        "client_id": "id",
                        "refresh_token": "env:RT",
                        "header": "X-Token",
                        "format": "Token {token}",
                    }
                },
            },
            "oauth2",
            {"x-token"},
        ),
        (
            {
                "secret": None,
                "hosts": ["api.github.com"],
                "inject": {
                    "github_app": {"app_id": 12345, "private_key": "file:app.pem", "installation_id": 9}
                },
            },
            "github_app",
            {"authorization"},
        ),
    ],
    ids=[
        "a header template",
        "a bare header",
        "basic auth with a username",
        "basic auth with user:password in the secret",
        "a query parameter",
        "a body placeholder with a size cap",
        "aws sigv4 with a literal key id",
        "oauth2 client credentials",
        "oauth2 refresh token to a loopback endpoint with a custom header",
        "a github app with a numeric app id",
    ],
)
def test_valid_credentials(fields: dict[str, Any], kind: str, managed: set[str]) -> None:
    data = {**BASE, **fields}
    if data.get("secret") is None:
        data.pop("secret")
    cred = Credential.model_validate(data)
    assert cred.kind == kind
    assert cred.managed_headers() == managed
    assert cred.ports == (443,)
    assert cred.apply == "placeholder"


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"inject": {"header": "A", "query": "k"}}, "inject needs exactly one of"),
        ({"inject": {"cookie": "x"}}, "inject needs exactly one of"),
        ({"inject": {"header": "Host"}}, "managed by the gateway"),
        ({"inject": {"header": "Proxy-Authorization"}}, "managed by the gateway"),
        ({"inject": {"header": "Bad Header"}}, "not an HTTP header name"),
        ({"inject": {"header": "A", "format": "Bearer"}}, "{secret} exactly once"),
        ({"inject": {"header": "A", "format": "{secret}{secret}"}}, "{secret} exactly once"),
        ({"inject": {"header": "A", "format": "{secret}\r\nX-Evil: 1"}}, "control characters"),
        ({"inject": {"header": "A"}, "extra": 1}, "Extra inputs are not permitted"),
        ({"inject": {"header": "A"}, "hosts": []}, "at least 1 item"),
        ({"inject": {"header": "A"}, "hosts": ["*"]}, "every host"),
        ({"inject": {"header": "A"}, "hosts": ["*.com"]}, "at least two labels"),
        ({"inject": {"header": "A"}, "hosts": ["API.Example.com"]}, "use 'api.example.com' instead"),
        ({"inject": {"header": "A"}, "hosts": ["a.*.example.com"]}, "only allowed as a leading"),
        ({"inject": {"header": "A"}, "ports": [0]}, "greater than or equal to 1"),
        ({"inject": {"header": "A"}, "paths": ["v1"]}, "starts with '/'"),
        ({"inject": {"header": "A"}, "paths": ["/v1/*"]}, "starts with '/'"),
        ({"inject": {"header": "A"}, "methods": ["get"]}, "upper-case HTTP method"),
        ({"inject": {"header": "A"}, "secret": "literal-key"}, "scheme:value"),
        ({"inject": {"header": "A"}, "secret": None}, "needs secret"),
        ({"inject": {"body": True}, "apply": "always"}, "apply: always means nothing"),
        ({"inject": {"basic": {"username": "a:b"}}}, "may not contain ':'"),
        ({"inject": {"header": "A"}, "env": "OPENAI API KEY"}, "String should match pattern"),
        ({"inject": {"query": "a b"}}, "String should match pattern"),
        ({"inject": {"aws_sigv4": {"region": "eu-west-1"}}}, "service"),
        (
            {
                "inject": {
                    "aws_sigv4": {
                        "region": "r",
                        "service": "s",
                        "access_key_id": "AKIAIOSFODNN7EXAMPLE",
                        "access_key_id_ref": "env:K",
                    }
                }
            },
            "not both",
        ),
        (
            {
                "inject": {
                    "oauth2": {"token_url": "https://a.example/t", "client_id": "i", "client_secret": "env:S"}
                }
            },
            "names its secrets inside inject.oauth2",
        ),
        (
            {
                "secret": None,
                "inject": {
                    "oauth2": {
                        "token_url": "http://auth.example.com/t",
                        "client_id": "i",
                        "client_secret": "env:S",
                    }
                },
            },
            "need https",
        ),
        (
            {"secret": None, "inject": {"oauth2": {"token_url": "https://a.example/t", "client_id": "i"}}},
            "needs client_secret",
        ),
        (
            {
                "secret": None,
                "inject": {
                    "oauth2": {"grant": "refresh_token", "token_url": "https://a.example/t", "client_id": "i"}
                },
            },
            "needs refresh_token",
        ),
        (
            {
                "secret": None,
                "inject": {"github_app": {"app_id": 1, "private_key": "file:k", "installation_id": 0}},
            },
            "greater than or equal to 1",
        ),
        (
            {
                "secret": None,
                "inject": {
                    "github_app": {
                        "app_id": 1,
                        "private_key": "file:k",
                        "installation_id": 1,
                        "permissions": {"contents": "owner"},
                    }
                },
            },
            "'read', 'write' or 'admin'",
        ),
    ],
    ids=[
        "two inject kinds are refused",
        "an unknown inject kind is refused",
        "the Host header cannot be managed",
        "Proxy-Authorization cannot be managed",
        "a header name with a space is refused",
        "a format without {secret} is refused",
        "a format with {secret} twice is refused",
        "a format with CRLF (header injection) is refused",
        "an unknown key is refused",
        "no hosts is refused",
        "a bare star host is refused",
        "a wildcard over a TLD is refused",
        "a non-normalised host is refused with the normal form",
        "a wildcard in the middle is refused",
        "port 0 is refused",
        "a relative path prefix is refused",
        "a glob path prefix is refused",
        "a lower-case method is refused",
        "a literal secret instead of a reference is refused",
        "a header credential without a secret is refused",
        "a body credential cannot apply always",
        "a basic username with a colon is refused",
        "an env name with spaces is refused",
        "a query parameter with a space is refused",
        "sigv4 without a service is refused",
        "sigv4 with two key ids is refused",
        "oauth2 with a top-level secret is refused",
        "oauth2 over plain http to a public host is refused",
        "oauth2 client credentials without a client secret is refused",
        "oauth2 refresh without a refresh token is refused",
        "a github app installation id 0 is refused",
        "a github app permission level must be known",
    ],
)
def test_invalid_credentials(fields: dict[str, Any], problem: str) -> None:
    data = {**BASE, **fields}
    if data.get("secret") is None:
        data.pop("secret")
    with pytest.raises(ValidationError) as info:
        Credential.model_validate(data)
    assert problem in str(info.value)


def test_the_model_has_a_json_schema() -> None:
    schema = Credential.model_json_schema()
    assert schema["additionalProperties"] is False
    assert {"name", "hosts", "inject"} <= set(schema["required"])
