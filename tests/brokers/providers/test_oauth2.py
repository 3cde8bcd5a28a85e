"""OAuth2 tokens from a real local token endpoint: fetched, cached until expiry minus skew, refreshed, never shown."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from support.oauth_server import OAuthTokenServer

from sandgate.brokers import (
    BrokerAllow,
    BrokerDenial,
    DenialCause,
    HttpxClient,
    PlaceholderMinter,
    SecretRegistry,
    TenantCredentials,
    TokenEndpointError,
    apply_mutations,
)
from sandgate.brokers.providers.oauth2 import OAuth2Provider
from sandgate.policy.model.credentials import OAuth2Spec
from sandgate.policy.reasons import Reason

from ..conftest import KEY, Clock, MemorySource, credential, make_broker, request

CLIENT_SECRET = "client-secret-0123456789"
REFRESH = "refresh-token-0123456789"
P = PlaceholderMinter(KEY).mint("t1", "sb1", "api")


@pytest.fixture
def memory() -> MemorySource:
    return MemorySource(cs=CLIENT_SECRET, rt=REFRESH)


def oauth_credential(server: OAuthTokenServer, **spec: Any) -> Any:
    block = {"token_url": server.token_url, "client_id": "sandgate-client", "client_secret": "mem:cs", **spec}
    return credential(name="api", hosts=["api.example.com"], inject={"oauth2": block})


def provider(
    server: OAuthTokenServer, registry: SecretRegistry, http: HttpxClient, clock: Clock, **spec: Any
) -> OAuth2Provider:
    block = {"token_url": server.token_url, "client_id": "sandgate-client", "client_secret": "mem:cs", **spec}
    return OAuth2Provider(OAuth2Spec.model_validate(block), secrets=registry, http=http, clock=clock)


@pytest.mark.parametrize(
    ("client_auth", "check"),
    [
        (
            "basic",
            lambda r: (
                r.headers["authorization"]
                == "Basic " + base64.b64encode(f"sandgate-client:{CLIENT_SECRET}".encode()).decode()
            ),
        ),
        ("post", lambda r: r.form["client_secret"] == CLIENT_SECRET and "authorization" not in r.headers),
    ],
    ids=["the client authenticates with basic auth", "the client authenticates in the form"],
)
async def test_client_credentials_grant(
    oauth_server: OAuthTokenServer,
    registry: SecretRegistry,
    http: HttpxClient,
    clock: Clock,
    client_auth: str,
    check: Any,
) -> None:
    p = provider(oauth_server, registry, http, clock, client_auth=client_auth, scope="read write")
    material = await p.material()
    assert material.secret.reveal() == oauth_server.issued[0]
    [received] = oauth_server.requests
    assert received.form["grant_type"] == "client_credentials"
    assert received.form["scope"] == "read write"
    assert received.headers["content-type"] == "application/x-www-form-urlencoded"
    assert check(received)


async def test_a_token_is_reused_until_expiry_minus_skew_then_refreshed(
    oauth_server: OAuthTokenServer, registry: SecretRegistry, http: HttpxClient, clock: Clock
) -> None:
    oauth_server.expires_in = 600
    p = provider(oauth_server, registry, http, clock, skew_seconds=60)
    first = (await p.material()).secret
    clock.advance(539)
    assert (await p.material()).secret == first
    assert len(oauth_server.requests) == 1
    clock.advance(1)  # 540 s: 60 s before expiry.
    second = (await p.material()).secret
    assert second != first
    assert second.reveal() == oauth_server.issued[1]


async def test_concurrent_requests_share_one_fetch(
    oauth_server: OAuthTokenServer, registry: SecretRegistry, http: HttpxClient, clock: Clock
) -> None:
    import asyncio

    p = provider(oauth_server, registry, http, clock)
    results = await asyncio.gather(*(p.material() for _ in range(20)))
    assert len(oauth_server.requests) == 1
    assert all(r.secret == results[0].secret for r in results)


async def test_a_short_lived_token_is_refreshed_halfway(
    oauth_server: OAuthTokenServer, registry: SecretRegistry, http: HttpxClient, clock: Clock
) -> None:
    oauth_server.expires_in = 30
    p = provider(oauth_server, registry, http, clock, skew_seconds=60)
    await p.material()
    clock.advance(14)
    await p.material()
    assert len(oauth_server.requests) == 1
    clock.advance(1)
    await p.material()
    assert len(oauth_server.requests) == 2


async def test_the_refresh_token_grant_follows_rotation(
    registry: SecretRegistry, http: HttpxClient, clock: Clock, memory: MemorySource
) -> None:
    with OAuthTokenServer(
        client_id="public-client",
        client_secret=None,
        refresh_token=REFRESH,
        expires_in=100,
        rotate_refresh=True,
    ) as server:
        p = OAuth2Provider(
            OAuth2Spec(
                grant="refresh_token",
                token_url=server.token_url,
                client_id="public-client",
                refresh_token="mem:rt",
            ),
            secrets=registry,
            http=http,
            clock=clock,
        )
        await p.material()
        clock.advance(100)
        material = await p.material()
        assert [r.form["refresh_token"] for r in server.requests] == [
            REFRESH,
            server.requests[1].form["refresh_token"],
        ]
        assert server.requests[1].form["refresh_token"] != REFRESH  # the rotated one was used
        assert server.requests[0].form["client_id"] == "public-client"
        # Both the rotated refresh token and the access token are scrubbed from responses.
        assert server.refresh_token in {s.reveal() for s in material.scrub}
        # An operator rotating the source wins over the in-memory one.
        memory.values["rt"] = server.refresh_token or ""
        clock.advance(100)
        await p.material()
        assert server.requests[2].form["refresh_token"] == memory.values["rt"]


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda s, m: setattr(s, "client_secret", "another"), "answered HTTP 401 (invalid_client)"),
        (lambda s, m: setattr(s, "fail_next", 1), "answered HTTP 503 (temporarily_unavailable)"),
        (lambda s, m: setattr(s, "expires_in", -5), "invalid expires_in"),
        (lambda s, m: m.values.pop("cs"), "memory secret cs is not set"),
    ],
    ids=[
        "a refused client is unavailable",
        "a failing endpoint is unavailable",
        "a nonsense expiry is refused",
        "a missing client secret is unavailable",
    ],
)
async def test_token_failures_fail_closed_without_echoing(
    oauth_server: OAuthTokenServer,
    registry: SecretRegistry,
    http: HttpxClient,
    clock: Clock,
    memory: MemorySource,
    setup: Any,
    message: str,
) -> None:
    setup(oauth_server, memory)
    broker = make_broker(
        registry,
        [TenantCredentials("t1", ("sb1",), (oauth_credential(oauth_server),))],
        http=http,
        clock=clock,
    )
    decision = await broker.plan(
        "t1", "sb1", request("api.example.com", headers=(("Authorization", f"Bearer {P}"),))
    )
    assert isinstance(decision, BrokerDenial)
    assert (decision.reason, decision.cause) == (Reason.INTERNAL_ERROR, DenialCause.SECRET_UNAVAILABLE)
    assert message in decision.detail
    assert CLIENT_SECRET not in decision.detail and "try later" not in decision.detail


async def test_a_failing_endpoint_is_not_hammered(
    oauth_server: OAuthTokenServer, registry: SecretRegistry, http: HttpxClient, clock: Clock
) -> None:
    oauth_server.fail_next = 1
    p = provider(oauth_server, registry, http, clock)
    for _ in range(3):
        with pytest.raises(TokenEndpointError):
            await p.material()
    assert len(oauth_server.requests) == 1
    clock.advance(1.5)
    await p.material()
    assert len(oauth_server.requests) == 2


async def test_an_unreachable_endpoint_is_unavailable(
    registry: SecretRegistry, http: HttpxClient, clock: Clock
) -> None:
    with OAuthTokenServer(client_id="c", client_secret="s") as server:
        url = server.token_url
    p = OAuth2Provider(
        OAuth2Spec(token_url=url, client_id="c", client_secret="mem:cs"),
        secrets=registry,
        http=http,
        clock=clock,
    )
    with pytest.raises(TokenEndpointError, match=r"token endpoint 127\.0\.0\.1 failed: ConnectError"):
        await p.material()


async def test_the_guest_sends_a_placeholder_and_never_sees_either_token(
    oauth_server: OAuthTokenServer, registry: SecretRegistry, http: HttpxClient, clock: Clock
) -> None:
    broker = make_broker(
        registry,
        [TenantCredentials("t1", ("sb1",), (oauth_credential(oauth_server),))],
        http=http,
        clock=clock,
    )
    req = request("api.example.com", headers=(("Authorization", f"Bearer {P}"),))
    decision = await broker.plan("t1", "sb1", req)
    assert isinstance(decision, BrokerAllow)
    assert decision.injectors == ("oauth2",)
    token = oauth_server.issued[0]
    assert ("Authorization", f"Bearer {token}") in apply_mutations(req, decision.mutations).headers
    # An upstream echoing the token or the client secret back: the guest gets the placeholder.
    echoed = broker.scrubber("t1", "sb1").scrub(
        f'{{"auth": "Bearer {token}", "cs": "{CLIENT_SECRET}"}}'.encode()
    )
    assert echoed == f'{{"auth": "Bearer {P}", "cs": "{P}"}}'.encode()
    # The next request within the token's life reuses it.
    await broker.plan("t1", "sb1", req)
    assert len(oauth_server.requests) == 1


async def test_proxy_variables_are_ignored(
    oauth_server: OAuthTokenServer, registry: SecretRegistry, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The gateway's own environment may point at the gateway itself; token requests go direct.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    client = HttpxClient(timeout=2.0)
    try:
        material = await provider(oauth_server, registry, client, clock).material()
    finally:
        await client.aclose()
    assert material.secret.reveal() == oauth_server.issued[0]
