"""The credential model a tenant file declares under `credentials:` (pydantic, unknown keys refused).

```yaml
credentials:
  - name: openai
    secret: env:OPENAI_API_KEY
    hosts: [api.openai.com]
    inject: {header: Authorization, format: "Bearer {secret}"}
```

`inject` is exactly one of: `header` (+ `format`), `basic`, `query`, `body`, `aws_sigv4`,
`oauth2`, `github_app`. The first five take the credential's `secret`; `oauth2` and
`github_app` name their own secrets inside the block and mint tokens from them.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from sandgate.policy.hosts import not_normal, parse_host_pattern, parse_ip_literal
from sandgate.policy.model.secret_refs import check_ref
from sandgate.policy.protocols.rules import ToolGlob

__all__ = [
    "AwsSigV4Inject",
    "AwsSigV4Spec",
    "BasicInject",
    "BasicSpec",
    "BodyInject",
    "Credential",
    "GitHubAppInject",
    "GitHubAppSpec",
    "HeaderInject",
    "Inject",
    "InjectKind",
    "OAuth2Inject",
    "OAuth2Spec",
    "QueryInject",
    "check_credential_host",
]

NAME_PATTERN = r"^[a-z0-9](?:[a-z0-9._-]{0,62})$"
InjectKind = Literal["header", "basic", "query", "body", "aws_sigv4", "oauth2", "github_app"]
TOKEN_KINDS: frozenset[str] = frozenset({"oauth2", "github_app"})

_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
_QUERY_NAME = re.compile(r"^[A-Za-z0-9._~-]{1,64}$")
_METHOD = re.compile(r"^[A-Z][A-Z0-9_-]{0,31}$")
_PATH_PREFIX = re.compile(r"^/[\x21-\x7e]*$")
_AWS_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_AWS_KEY_ID = re.compile(r"^[A-Z0-9]{16,128}$")
# Headers the gateway owns or that frame the message: a credential may not set them.
_RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)
_FORBIDDEN_TEXT = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

Port = Annotated[int, Field(ge=1, le=65535)]


def check_header_name(value: str) -> str:
    """A header name a credential may manage (a token, not one the gateway owns)."""
    if not _HEADER_NAME.match(value):
        raise ValueError(f"{value!r} is not an HTTP header name")
    if value.lower() in _RESERVED_HEADERS:
        raise ValueError(f"{value!r} is managed by the gateway; a credential cannot set it")
    return value


def check_credential_host(value: str) -> str:
    """`host` or `*.suffix` in normal form; no bare `*`, no wildcard over a top-level domain."""
    wildcard, bare, normal = parse_host_pattern(value, "bind the credential to every host; name its hosts")
    if (error := not_normal(value, wildcard, bare, normal)) is not None:
        raise error
    if wildcard and (parse_ip_literal(bare) is not None or "." not in bare):
        raise ValueError(f"{value!r}: a wildcard needs a domain of at least two labels")
    return value


def _check_method(value: str) -> str:
    if not _METHOD.match(value):
        raise ValueError(f"{value!r} is not an upper-case HTTP method")
    return value


def _check_path_prefix(value: str) -> str:
    if not _PATH_PREFIX.match(value) or "*" in value or "?" in value or "#" in value:
        raise ValueError(f"{value!r}: a path prefix starts with '/' and has no spaces, '*', '?' or '#'")
    return value


def _check_template(value: str, field: str) -> str:
    if value.count("{" + field + "}") != 1:
        raise ValueError(f"format must contain {{{field}}} exactly once")
    if _FORBIDDEN_TEXT.search(value):
        raise ValueError("format may not contain control characters")
    return value


def _check_token_url(value: str) -> str:
    """An absolute https URL; plain http only to a loopback address (a local test endpoint)."""
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.username or parts.fragment:
        raise ValueError(f"{value!r} is not an absolute http(s) URL without userinfo or fragment")
    if parts.scheme == "http":
        host = parts.hostname
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(f"{value!r}: token endpoints need https (http only to a loopback address)")
    return value


HeaderName = Annotated[str, AfterValidator(check_header_name)]
SecretRefText = Annotated[str, AfterValidator(check_ref)]
HostPattern = Annotated[str, AfterValidator(check_credential_host)]
Method = Annotated[str, AfterValidator(_check_method)]
PathPrefix = Annotated[str, AfterValidator(_check_path_prefix)]
TokenUrl = Annotated[str, AfterValidator(_check_token_url)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HeaderInject(_Strict):
    """Set one header from a template: `{header: Authorization, format: "Bearer {secret}"}`."""

    header: HeaderName = Field(
        description=(
            "the header to set (a guest's copy is replaced); not one the gateway manages, such as "
            "Host, Content-Length or Proxy-Authorization"
        )
    )
    format: str = Field(
        default="{secret}",
        description="the header's value, where `{secret}` (exactly once) stands for the secret",
    )

    @model_validator(mode="after")
    def _format_ok(self) -> HeaderInject:
        _check_template(self.format, "secret")
        return self


class BasicSpec(_Strict):
    """`username` given: the secret is the password. Absent: the secret holds `user:password`."""

    username: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description=(
            "the user name (no ':'); the secret is then the password. Unset: the secret holds `user:password`"
        ),
    )

    @model_validator(mode="after")
    def _username_ok(self) -> BasicSpec:
        if self.username is not None and (":" in self.username or _FORBIDDEN_TEXT.search(self.username)):
            raise ValueError("username may not contain ':' or control characters")
        return self


class BasicInject(_Strict):
    """HTTP basic auth: `{basic: {username: deploy}}` or `{basic: {}}`."""

    basic: BasicSpec


class QueryInject(_Strict):
    """Set one query parameter: `{query: api_key}`."""

    query: str = Field(
        pattern=_QUERY_NAME.pattern,
        description=(
            "the query parameter set to the secret (in place of the value the guest sent, the placeholder)"
        ),
    )


class BodyInject(_Strict):
    """Replace the placeholder inside the request body (JSON, form or text), up to `max_bytes`."""

    body: Literal[True] = Field(
        description=(
            "replace this credential's placeholder wherever it stands raw in the body (encoded for its "
            "content type)"
        )
    )
    max_bytes: int = Field(
        default=1 << 20,
        ge=1,
        le=64 << 20,
        description=(
            "the largest body, in bytes, the placeholder is replaced in; a larger one carrying it: "
            "body_too_large"
        ),
    )


class AwsSigV4Spec(_Strict):
    """Re-sign AWS SigV4: the secret is the secret access key (or `KEYID:SECRET` without a key id)."""

    region: str = Field(pattern=_AWS_NAME.pattern, description="the AWS region the request is signed for")
    service: str = Field(
        pattern=_AWS_NAME.pattern, description="the AWS service name the request is signed for (s3, sts, ...)"
    )
    access_key_id: str | None = Field(
        default=None,
        pattern=_AWS_KEY_ID.pattern,
        description="the access key id, written out (it is not secret); not with access_key_id_ref",
    )
    access_key_id_ref: SecretRefText | None = Field(
        default=None,
        description=(
            "a reference to the access key id (env:NAME, file:PATH, cmd:PROGRAM ARGS or stored:NAME), "
            "read like a secret. Neither this nor access_key_id: the secret holds `KEYID:SECRET`"
        ),
    )
    session_token_ref: SecretRefText | None = Field(
        default=None,
        description=(
            "a reference to a session token (temporary credentials), sent as X-Amz-Security-Token and signed"
        ),
    )

    @model_validator(mode="after")
    def _one_key_id(self) -> AwsSigV4Spec:
        if self.access_key_id is not None and self.access_key_id_ref is not None:
            raise ValueError("give access_key_id or access_key_id_ref, not both")
        return self


class AwsSigV4Inject(_Strict):
    aws_sigv4: AwsSigV4Spec


class OAuth2Spec(_Strict):
    """An OAuth2 access token from `token_url` (client credentials, or a refresh token), cached."""

    grant: Literal["client_credentials", "refresh_token"] = Field(
        default="client_credentials",
        description=(
            "client_credentials: a token for the client itself (needs client_secret); refresh_token: "
            "a token for refresh_token (a new refresh token the server returns is used next)"
        ),
    )
    token_url: TokenUrl = Field(
        description=(
            "the token endpoint: https (plain http only to a loopback address), no userinfo or fragment"
        )
    )
    client_id: str = Field(min_length=1, max_length=512, description="the client id (not secret)")
    client_secret: SecretRefText | None = Field(
        default=None,
        description=(
            "a reference to the client secret (env:NAME, file:PATH, cmd:PROGRAM ARGS or stored:NAME); "
            "required with grant client_credentials"
        ),
    )
    refresh_token: SecretRefText | None = Field(
        default=None,
        description=(
            "a reference to the refresh token; required with grant refresh_token, refused with the other"
        ),
    )
    scope: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description="the scope asked of the token endpoint; unset: none asked (the server's default)",
    )
    client_auth: Literal["basic", "post"] = Field(
        default="basic",
        description=(
            "how the client authenticates at the token endpoint: basic (an Authorization header) or "
            "post (client_id and client_secret in the form body)"
        ),
    )
    header: HeaderName = Field(default="Authorization", description="the header the access token is set in")
    format: str = Field(
        default="Bearer {token}",
        description="the header's value, where `{token}` (exactly once) stands for the access token",
    )
    skew_seconds: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description=(
            "a token is replaced this many seconds before it expires (at the latest halfway through its life)"
        ),
    )
    default_expires_in: float = Field(
        default=300.0,
        gt=0,
        le=86400,
        description="seconds a token is taken to live when the endpoint's answer has no expires_in",
    )

    @model_validator(mode="after")
    def _grant_inputs(self) -> OAuth2Spec:
        _check_template(self.format, "token")
        if self.grant == "client_credentials" and self.client_secret is None:
            raise ValueError("grant client_credentials needs client_secret")
        if self.grant == "refresh_token" and self.refresh_token is None:
            raise ValueError("grant refresh_token needs refresh_token")
        if self.grant == "client_credentials" and self.refresh_token is not None:
            raise ValueError("refresh_token is only used with grant refresh_token")
        return self


class OAuth2Inject(_Strict):
    oauth2: OAuth2Spec


class GitHubAppSpec(_Strict):
    """A GitHub App installation token, minted with a JWT signed by the app's private key."""

    app_id: Annotated[
        str,
        Field(
            pattern=r"^[A-Za-z0-9._-]{1,64}$",
            description=(
                "the GitHub App's id, the issuer of the JWTs that buy its tokens; a number is read as text"
            ),
        ),
    ]
    private_key: SecretRefText = Field(
        description=(
            "a reference to the app's private key, an unencrypted RSA PEM (env:NAME, file:PATH, cmd:PROGRAM "
            "ARGS or stored:NAME); read at every mint"
        )
    )
    installation_id: int = Field(ge=1, description="the installation whose tokens are minted")
    api_url: TokenUrl = Field(
        default="https://api.github.com",
        description="the GitHub API's base URL; a GitHub Enterprise Server's `https://HOST/api/v3`",
    )
    repositories: tuple[Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,100}$")], ...] | None = Field(
        default=None,
        description="repository names the token is limited to; unset: every repository of the installation",
    )
    permissions: (
        dict[Annotated[str, Field(pattern=r"^[a-z_]{1,64}$")], Literal["read", "write", "admin"]] | None
    ) = Field(
        default=None,
        description=(
            "permissions the token is limited to (name → read, write or admin); unset: the installation's"
        ),
    )
    header: HeaderName = Field(
        default="Authorization", description="the header the installation token is set in"
    )
    format: str = Field(
        default="Bearer {token}",
        description="the header's value, where `{token}` (exactly once) stands for the installation token",
    )
    skew_seconds: float = Field(
        default=300.0,
        ge=0,
        le=3000,
        description=(
            "a token is replaced this many seconds before it expires (at the latest halfway through its life)"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _app_id_text(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("app_id"), int):
            return {**data, "app_id": str(data["app_id"])}
        return data

    @model_validator(mode="after")
    def _format_ok(self) -> GitHubAppSpec:
        _check_template(self.format, "token")
        return self


class GitHubAppInject(_Strict):
    github_app: GitHubAppSpec


_KEYS: tuple[InjectKind, ...] = ("header", "basic", "query", "body", "aws_sigv4", "oauth2", "github_app")


def _inject_tag(value: Any) -> str | None:
    """Which inject block this is, from its one distinguishing key."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if not isinstance(value, dict):
        return None
    found = [k for k in _KEYS if k in value]
    return found[0] if len(found) == 1 else None


Inject = Annotated[
    Annotated[HeaderInject, Tag("header")]
    | Annotated[BasicInject, Tag("basic")]
    | Annotated[QueryInject, Tag("query")]
    | Annotated[BodyInject, Tag("body")]
    | Annotated[AwsSigV4Inject, Tag("aws_sigv4")]
    | Annotated[OAuth2Inject, Tag("oauth2")]
    | Annotated[GitHubAppInject, Tag("github_app")],
    Discriminator(
        _inject_tag,
        custom_error_type="inject_kind",
        custom_error_message="inject needs exactly one of: " + ", ".join(_KEYS),
    ),
]


class Credential(_Strict):
    """One credential: where it may go (hosts, ports, paths, methods) and how it is injected.

    `env` names the guest environment variable that holds the placeholder.
    `apply: placeholder` (the default) injects only into a request that carries this
    credential's placeholder in the place the injector manages; `apply: always` injects into
    every request that matches the binding. `plaintext: true` allows injection over `http://`.
    `tools` (body only) narrows a body credential to the arguments of MCP tool calls.
    """

    name: str = Field(
        pattern=NAME_PATTERN,
        description=(
            "the credential's name, unique in its tenant: in audit records, and the guest variable "
            "SANDGATE_<NAME> unless env says otherwise"
        ),
    )
    secret: SecretRefText | None = Field(
        default=None,
        description=(
            "where the secret is read: env:NAME, file:PATH (relative to this file), cmd:PROGRAM ARGS or "
            "stored:NAME (this tenant's stored value). Not for oauth2 and github_app, which name theirs "
            "in inject"
        ),
    )
    hosts: tuple[HostPattern, ...] = Field(
        min_length=1,
        description="hosts it is injected for, exact or '*.suffix' (never '*'); they are always intercepted",
    )
    ports: tuple[Port, ...] = Field(default=(443,), min_length=1, description="ports it is injected for")
    plaintext: bool = Field(
        default=False,
        description="also inject into plain http:// requests, where the secret crosses the wire unencrypted",
    )
    paths: tuple[PathPrefix, ...] | None = Field(
        default=None,
        min_length=1,
        description=(
            "path prefixes it is injected under (`/v1` covers /v1 and /v1/..., not /v10); unset: every path"
        ),
    )
    methods: tuple[Method, ...] | None = Field(
        default=None, min_length=1, description="HTTP methods it is injected for; unset: every method"
    )
    inject: Inject = Field(
        description="how: exactly one of header, basic, query, body, aws_sigv4, oauth2, github_app"
    )
    apply: Literal["placeholder", "always"] = Field(
        default="placeholder",
        description=(
            "placeholder: only into a request that carries this credential's placeholder where the "
            "injector looks; always: into every request inside the binding (not for body)"
        ),
    )
    tools: tuple[ToolGlob, ...] | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description=(
            "MCP tool name globs (`*`, `?`; case as written): the placeholder is replaced only inside "
            "`params.arguments` of a `tools/call` of a matching tool, in a body an `mcp:` rule read; "
            "anywhere else it is refused. Only with inject body; unset: anywhere in the body"
        ),
    )
    # The guest environment variable that receives this credential's placeholder (sandgate jail).
    env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

    @property
    def kind(self) -> InjectKind:
        """The injector kind, as audited."""
        tag = _inject_tag(self.inject)
        assert tag is not None
        return tag  # type: ignore[return-value]

    @model_validator(mode="after")
    def _secret_matches_kind(self) -> Credential:
        kind = self.kind
        if kind in TOKEN_KINDS and self.secret is not None:
            raise ValueError(f"a {kind} credential names its secrets inside inject.{kind}, not in secret")
        if kind not in TOKEN_KINDS and self.secret is None:
            raise ValueError(f"a {kind} credential needs secret (env:NAME, file:PATH or cmd:...)")
        if kind == "body" and self.apply == "always":
            raise ValueError("a body credential replaces its placeholder; apply: always means nothing here")
        if self.tools is not None and kind != "body":
            raise ValueError("tools binds a placeholder in tool arguments: only with inject body")
        return self

    def managed_headers(self) -> frozenset[str]:
        """Lower-case names of the headers this credential sets (a client copy is replaced)."""
        inject = self.inject
        if isinstance(inject, HeaderInject):
            return frozenset({inject.header.lower()})
        if isinstance(inject, BasicInject):
            return frozenset({"authorization"})
        if isinstance(inject, OAuth2Inject):
            return frozenset({inject.oauth2.header.lower()})
        if isinstance(inject, GitHubAppInject):
            return frozenset({inject.github_app.header.lower()})
        if isinstance(inject, AwsSigV4Inject):
            return frozenset({"authorization", "x-amz-date", "x-amz-security-token"})
        return frozenset()
