"""GitHub App installation tokens from a GitHub-API-like local endpoint that verifies the app JWT."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from support.github_server import GitHubAppServer, verify_app_jwt

from sandgate.brokers import (
    Broker,
    BrokerAllow,
    BrokerDenial,
    DenialCause,
    HttpxClient,
    PlaceholderMinter,
    TenantCredentials,
    apply_mutations,
    default_registry,
)
from sandgate.brokers.providers.github_app import app_jwt

from ..conftest import KEY, Clock, credential, request

APP_ID = "123456"
INSTALLATION = 4242
P = PlaceholderMinter(KEY).mint("t1", "sb1", "gh")


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


KEY_A = new_key()
KEY_B = new_key()


def write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(pem)
    path.chmod(0o600)


@pytest.fixture
def server(clock: Clock) -> Iterator[GitHubAppServer]:
    with GitHubAppServer(
        app_id=APP_ID, public_key=KEY_A.public_key(), installation_id=INSTALLATION, clock=clock
    ) as s:
        yield s


def gh_broker(
    tmp_path: Path, server: GitHubAppServer, http: HttpxClient, clock: Clock, **spec: Any
) -> Broker:
    write_key(tmp_path / "app.pem", KEY_A)
    block = {
        "app_id": int(APP_ID),
        "private_key": "file:app.pem",
        "installation_id": INSTALLATION,
        "api_url": server.url,
        **spec,
    }
    cred = credential(name="gh", hosts=["api.github.com"], inject={"github_app": block})
    broker = Broker(placeholder_key=KEY, secrets=default_registry(), http=http, clock=clock)
    broker.configure([TenantCredentials("t1", ("sb1",), (cred,), base_dir=tmp_path)])
    return broker


def test_the_app_jwt_verifies_with_the_public_key() -> None:
    jwt = app_jwt(APP_ID, KEY_A, 1_800_000_000)
    claims = verify_app_jwt(jwt, KEY_A.public_key(), APP_ID, 1_800_000_000)
    assert claims == {"iat": 1_800_000_000 - 60, "exp": 1_800_000_000 + 540, "iss": APP_ID}
    with pytest.raises(ValueError, match="bad signature"):
        verify_app_jwt(jwt, KEY_B.public_key(), APP_ID, 1_800_000_000)


async def test_an_installation_token_is_minted_injected_and_cached(
    tmp_path: Path, server: GitHubAppServer, http: HttpxClient, clock: Clock
) -> None:
    broker = gh_broker(tmp_path, server, http, clock)
    req = request("api.github.com", "/repos/o/r/issues", headers=(("Authorization", f"token {P}"),))
    decision = await broker.plan("t1", "sb1", req)
    assert isinstance(decision, BrokerAllow)
    assert decision.injectors == ("github_app",)
    [received] = server.requests
    assert received.path == f"/app/installations/{INSTALLATION}/access_tokens"
    assert received.headers["accept"] == "application/vnd.github+json"
    assert received.headers["x-github-api-version"] == "2022-11-28"
    assert server.claims[0]["iss"] == APP_ID
    token = server.issued[0]
    assert ("Authorization", f"Bearer {token}") in apply_mutations(req, decision.mutations).headers
    # Cached: another request within the hour does not mint again.
    clock.advance(3600 - 301)
    await broker.plan("t1", "sb1", req)
    assert len(server.requests) == 1
    # Five minutes (the skew) before expiry a new one is minted.
    clock.advance(1)
    decision = await broker.plan("t1", "sb1", req)
    assert isinstance(decision, BrokerAllow)
    assert len(server.issued) == 2
    assert ("Authorization", f"Bearer {server.issued[1]}") in apply_mutations(req, decision.mutations).headers
    # Both tokens are scrubbed (an echo of the old one may still be in flight).
    assert (
        broker.scrubber("t1", "sb1").scrub(f"{server.issued[0]} {server.issued[1]}".encode())
        == f"{P} {P}".encode()
    )


async def test_repositories_and_permissions_narrow_the_token(
    tmp_path: Path, server: GitHubAppServer, http: HttpxClient, clock: Clock
) -> None:
    broker = gh_broker(tmp_path, server, http, clock, repositories=["r1"], permissions={"contents": "read"})
    await broker.plan("t1", "sb1", request("api.github.com", headers=(("Authorization", f"Bearer {P}"),)))
    [received] = server.requests
    assert json.loads(received.body) == {"repositories": ["r1"], "permissions": {"contents": "read"}}


async def test_a_rotated_key_file_is_used_for_the_next_mint(
    tmp_path: Path, server: GitHubAppServer, http: HttpxClient, clock: Clock
) -> None:
    broker = gh_broker(tmp_path, server, http, clock)
    req = request("api.github.com", headers=(("Authorization", f"Bearer {P}"),))
    assert isinstance(await broker.plan("t1", "sb1", req), BrokerAllow)
    write_key(tmp_path / "app.pem", KEY_B)
    clock.advance(3600)
    denial = await broker.plan("t1", "sb1", req)  # the server still trusts only key A
    assert isinstance(denial, BrokerDenial)
    assert denial.cause is DenialCause.SECRET_UNAVAILABLE
    assert f"answered HTTP 401 for installation {INSTALLATION}" in denial.detail
    server.public_key = KEY_B.public_key()
    clock.advance(2)  # past the failure backoff
    assert isinstance(await broker.plan("t1", "sb1", req), BrokerAllow)


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"not a pem", "not an unencrypted PEM private key"), (None, "No such file")],
    ids=["a broken key fails closed", "a missing key fails closed"],
)
async def test_an_unusable_key_fails_closed(
    tmp_path: Path,
    server: GitHubAppServer,
    http: HttpxClient,
    clock: Clock,
    content: bytes | None,
    message: str,
) -> None:
    broker = gh_broker(tmp_path, server, http, clock)
    if content is None:
        (tmp_path / "app.pem").unlink()
    else:
        (tmp_path / "app.pem").write_bytes(content)
    decision = await broker.plan(
        "t1", "sb1", request("api.github.com", headers=(("Authorization", f"Bearer {P}"),))
    )
    assert isinstance(decision, BrokerDenial)
    assert message in decision.detail
    assert server.requests == []
