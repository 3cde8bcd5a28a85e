"""The scrubbers know every secret a tenant can inject before any request injected it."""

from __future__ import annotations

import base64

import pytest
from structlog.testing import capture_logs

from sandgate.brokers import (
    BrokerAllow,
    BrokerDenial,
    PlaceholderMinter,
    SecretRegistry,
    TenantCredentials,
)

from .conftest import KEY, MemorySource, credential, header_credential, make_broker, request

MINTER = PlaceholderMinter(KEY)
OURS = "sk-live-ours-0123456789abcdef"
ROTATED = "sk-live-rotated-9876543210"
THEIRS = "sk-live-theirs-0123456789abcdef"
CLIENT_SECRET = "client-secret-0123456789"


@pytest.fixture
def memory() -> MemorySource:
    return MemorySource(openai=OURS, theirs=THEIRS, cs=CLIENT_SECRET)


def tenants() -> list[TenantCredentials]:
    oauth = credential(
        name="api",
        hosts=["api.example.com"],
        inject={
            "oauth2": {"token_url": "https://127.0.0.1:9/token", "client_id": "c", "client_secret": "mem:cs"}
        },
    )
    return [
        TenantCredentials("t1", ("sb1",), (header_credential("openai"), oauth)),
        TenantCredentials("t2", ("x",), (header_credential("theirs", secret="mem:theirs"),)),
    ]


async def test_a_request_that_injects_nothing_waits_until_its_tenants_secrets_are_known(
    registry: SecretRegistry,
) -> None:
    broker = make_broker(registry, tenants())
    assert broker.scrubber("t1", "sb1").empty, "nothing resolved yet"
    decision = await broker.plan("t1", "sb1", request("api.openai.com"))  # no placeholder
    assert decision == BrokerAllow()
    echo = f"key={OURS} basic={base64.b64encode(f'u:{OURS}'.encode()).decode()} cs={CLIENT_SECRET}"
    scrubbed = broker.scrubber("t1", "sb1").scrub(echo.encode()).decode()
    assert OURS not in scrubbed and CLIENT_SECRET not in scrubbed
    assert MINTER.mint("t1", "sb1", "openai") in scrubbed
    assert MINTER.mint("t1", "sb1", "api") in scrubbed  # an OAuth2 client secret, before any token


async def test_a_tenants_scrubber_holds_its_own_secrets_only(registry: SecretRegistry) -> None:
    broker = make_broker(registry, tenants())
    await broker.refresh()
    assert broker.scrubber("t1", "sb1").scrub(THEIRS.encode()) == THEIRS.encode()
    assert broker.scrubber("t2", "x").scrub(THEIRS.encode()) == MINTER.mint("t2", "x", "theirs").encode()


async def test_a_changed_value_is_known_before_the_next_request_and_the_old_one_still_scrubbed(
    registry: SecretRegistry, memory: MemorySource
) -> None:
    broker = make_broker(registry, tenants())
    await broker.refresh()
    memory.values["openai"] = ROTATED
    broker.secrets_changed()  # a stored credential was rotated
    await broker.plan("t1", "sb1", request("api.openai.com"))
    placeholder = MINTER.mint("t1", "sb1", "openai")
    assert (
        broker.scrubber("t1", "sb1").scrub(f"{OURS} {ROTATED}".encode())
        == f"{placeholder} {placeholder}".encode()
    )


async def test_a_secret_that_cannot_be_resolved_is_logged_once_and_known_once_it_can(
    registry: SecretRegistry, memory: MemorySource
) -> None:
    del memory.values["openai"]
    broker = make_broker(registry, tenants())
    with capture_logs() as events:
        for _ in range(3):
            await broker.refresh()
        placeholder = MINTER.mint("t1", "sb1", "openai")
        denied = await broker.plan(
            "t1", "sb1", request(headers=(("Authorization", f"Bearer {placeholder}"),))
        )
        memory.values["openai"] = OURS
        await broker.refresh()
    assert isinstance(denied, BrokerDenial), "its injections fail closed meanwhile"
    names = [e["event"] for e in events]
    assert names.count("broker.secret_unresolved") == 1
    assert names[-1] == "broker.secret_resolved"
    assert OURS not in repr(events)
    assert broker.scrubber("t1", "sb1").scrub(OURS.encode()) == placeholder.encode()


async def test_a_secret_resolved_by_refresh_is_not_read_again_by_a_request_that_injects_nothing(
    registry: SecretRegistry, memory: MemorySource
) -> None:
    broker = make_broker(registry, tenants())
    await broker.refresh()
    reads = memory.reads
    for _ in range(5):
        await broker.plan("t1", "sb1", request("api.openai.com"))
    assert memory.reads == reads, "the request path resolved nothing"


async def test_a_credential_added_by_a_reload_is_known_before_the_next_request_is_forwarded(
    registry: SecretRegistry, memory: MemorySource
) -> None:
    broker = make_broker(registry, tenants()[1:])
    await broker.refresh()
    broker.configure(tenants())  # t1 appears with its credentials
    memory.values["openai"] = ROTATED
    await broker.plan("t1", "sb1", request("api.openai.com"))
    assert broker.scrubber("t1", "sb1").scrub(ROTATED.encode()) == MINTER.mint("t1", "sb1", "openai").encode()
